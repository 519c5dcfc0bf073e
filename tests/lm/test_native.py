"""The native int8 x 16-bit kernel (`lm.native`) against its XLA reference, by hand, and inside decoding."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.lm import generation, llama, native, quant

CFG = llama.tiny_config(vocab_size=64, hidden_size=64, intermediate_size=128)


def _kernel_or_skip():
  if not native.available():
    pytest.skip(f"the native kernel is not in use here: {native.unavailable_reason()}")


def test_quantize_activations_by_hand():
  # one group of 32: max |x| = 1.27, so d = 0.01; 0.005 / d = 0.5 rounds to 0 (ties to even) with remainder 0.5,
  # whose second code clips 128 to 127; 0.0123 / d = 1.23 -> a1 = 1, a2 = round(0.23 * 256) = 59.
  x = np.zeros((1, 32), np.float32)
  x[0, :3] = [1.27, 0.005, 0.0123]
  c, step = native.quantize_activations(jnp.asarray(x))
  np.testing.assert_allclose(float(step[0, 0]), 0.01 / 256, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(c)[0, 0, :4], [127 * 256, 127, 256 + 59, 0])
  # an all-zero group has step 0 and codes 0
  c0, s0 = native.quantize_activations(jnp.zeros((2, 64), jnp.float32))
  assert not np.any(np.asarray(c0)) and not np.any(np.asarray(s0))


@pytest.mark.parametrize("rows,inputs,outputs", [(1, 576, 300), (3, 96, 40), (8, 1536, 72), (9, 64, 33),
                                                 (13, 160, 17)])
@pytest.mark.parametrize("affine", [True, False])
def test_kernel_matches_reference_and_float(rows, inputs, outputs, affine):
  """Every row-block size (8, 4, 2, 1 rows), an odd number of groups (96 and 160 inputs), output counts that do not
  divide into the kernel's pieces: equal to the XLA reference up to float summation order, and within the
  weights' own rounding of the float32 product."""
  _kernel_or_skip()
  rng = np.random.default_rng(rows * 1000 + inputs)
  w = rng.normal(size=(outputs, inputs)).astype(np.float32)
  x = rng.normal(size=(rows, inputs)).astype(np.float32) * np.where(rng.random(inputs) < 0.05, 30.0, 1.0)
  q, s, m = quant.quantize_groups(jnp.asarray(w), 32, affine=affine)
  got = np.asarray(jax.jit(native.q8_matmul)(jnp.asarray(x), q, s, m))
  ref = np.asarray(jax.jit(native.q8_matmul_reference)(jnp.asarray(x), q, s, m))
  scale = np.abs(ref).max()
  np.testing.assert_allclose(got, ref, atol=2e-6 * scale * np.sqrt(inputs))
  # against the float product of the same weights: off by at most the activations' rounding, half a step each
  widened = np.asarray(quant.dequantize_groups(q, s, m), np.float64)
  _, step = native.quantize_activations(jnp.asarray(x))
  half_step = np.repeat(np.asarray(step, np.float64), 32, axis=1) / 2             # [R, I]
  bound = half_step @ np.abs(widened).T + 1e-5 * scale
  assert np.all(np.abs(got - x.astype(np.float64) @ widened.T) <= bound)


def test_kernel_under_vmap_and_in_a_while_loop():
  """vmap runs the call once per member; a loop-invariant weight inside `while_loop` stays correct."""
  _kernel_or_skip()
  rng = np.random.default_rng(1)
  q, s, m = quant.quantize_groups(jnp.asarray(rng.normal(size=(40, 64)), jnp.float32), 32, affine=True)
  xs = jnp.asarray(rng.normal(size=(3, 2, 64)), jnp.float32)
  got = jax.jit(jax.vmap(lambda x: native.q8_matmul(x, q, s, m)))(xs)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(got[i]), np.asarray(native.q8_matmul_reference(xs[i], q, s, m)),
                               rtol=1e-5, atol=1e-4)

  qw, sw, mw = quant.quantize_groups(jnp.asarray(rng.normal(size=(64, 64)), jnp.float32), 32, affine=True)

  def loop(matmul):  # the weights are loop-invariant; each iteration's input is computed by the same XLA ops
    def body(carry):
      i, acc = carry
      return i + 1, acc + matmul(xs[0] * (i + 1).astype(jnp.float32), qw, sw, mw)
    return jax.jit(lambda: jax.lax.while_loop(lambda c: c[0] < 5, body, (0, jnp.zeros((2, 64))))[1])

  out, ref = loop(native.q8_matmul)(), loop(native.q8_matmul_reference)()
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-4)


def test_bad_input_messages():
  q, s, m = quant.quantize_groups(jnp.ones((8, 64), jnp.float32), 32, affine=True)
  with pytest.raises(ValueError, match="multiple of 32"):
    native.q8_matmul(jnp.ones((1, 48)), q[:, :48], s, m)
  with pytest.raises(ValueError, match="scale"):
    native.q8_matmul(jnp.ones((1, 64)), q, s[:, :1], m)
  with pytest.raises(ValueError, match="uint8 codes take a minimum"):
    native.q8_matmul(jnp.ones((1, 64)), q, s, None)
  with pytest.raises(ValueError, match="groups are 32"):
    quant.convert_params(llama.fuse_params(llama.init_params(jax.random.key(0), CFG)), "int8_a16", group_size=16)


def test_int8_a16_format_decodes_like_int8():
  """The format end to end on a tiny model: greedy tokens equal those of the `int8` format (the same codes with
  float32 activations), at batch 1 and batch 3 (one row and several rows through the kernel), with and without
  the KV cache; log-probabilities within the 16-bit activations' rounding."""
  params = llama.fuse_params(llama.init_params(jax.random.key(0), CFG))
  fast = quant.convert_params(params, "int8_a16")
  assert quant.weight_format(fast) == "int8_a16" and quant.batched_decoding_params(fast) is fast
  # the reference: the very same codes, multiplied with float32 activations
  int8 = quant.convert_params(params, "int8")
  assert np.array_equal(np.asarray(int8["layers"][0]["qkv_proj"]["kernel_int8"]),
                        np.asarray(fast["layers"][0]["qkv_proj"]["kernel_a16"]))
  ids = jax.random.randint(jax.random.key(1), (3, 6), 1, CFG.vocab_size)
  mask = jnp.ones_like(ids, bool)
  run = jax.jit(lambda p, i, m, cache: generation.generate(p, CFG, i, m, jax.random.key(2), 8, use_cache=cache),
                static_argnums=3)
  ref = run(int8, ids, mask, True)
  for b in (1, 3):
    for cache in (True, False):
      out = run(fast, ids[:b], mask[:b], cache)
      np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens[:b]))
      np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs[:b]), atol=2e-3)


def test_switched_off_runs_the_reference():
  """ICLR24_NATIVE=0: no build, the reason says so, and the format still computes the same numbers."""
  code = ("import jax, jax.numpy as jnp, numpy as np\n"
          "from iclr24_jax.lm import native, quant\n"
          "q, s, m = quant.quantize_groups(jnp.asarray(np.random.default_rng(0).normal(size=(8, 64)), jnp.float32),"
          " 32, affine=True)\n"
          "x = jnp.ones((2, 64))\n"
          "y = native.q8_matmul(x, q, s, m)\n"
          "assert not native.available() and 'ICLR24_NATIVE=0' in native.unavailable_reason()\n"
          "np.testing.assert_allclose(np.asarray(y), np.asarray(native.q8_matmul_reference(x, q, s, m)))\n"
          "print('ok')\n")
  env = {**os.environ, native.ENV_SWITCH: "0", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_activations_give_non_finite_rows(affine, bad):
  """A NaN or inf in a row's activations makes that row's outputs non-finite (never a finite wrong number);
  the other rows are unaffected."""
  _kernel_or_skip()
  rng = np.random.default_rng(3)
  q, s, m = quant.quantize_groups(jnp.asarray(rng.normal(size=(24, 96)), jnp.float32), 32, affine=affine)
  x = rng.normal(size=(3, 96)).astype(np.float32)
  x[1, 40] = bad
  got = np.asarray(jax.jit(native.q8_matmul)(jnp.asarray(x), q, s, m))
  assert not np.isfinite(got[1]).any()
  ref = np.asarray(native.q8_matmul_reference(jnp.asarray(x[[0, 2]]), q, s, m))
  np.testing.assert_allclose(got[[0, 2]], ref, rtol=1e-5, atol=1e-4)
