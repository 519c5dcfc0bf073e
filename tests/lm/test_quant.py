"""Compact weight formats (`lm.quant`): group-wise 8-bit codes, bfloat16, and their matmul / decoding paths."""
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from iclr24_jax.lm import generation, layers, llama, lora, quant

CFG = llama.tiny_config(vocab_size=64, hidden_size=64, intermediate_size=128)


@pytest.fixture(scope="module")
def fused():
  return llama.fuse_params(llama.init_params(jax.random.key(0), CFG))


def _dequantized_float(q):
  """The float32 pytree whose kernels are exactly the int8 format's dequantized weights ([in, out])."""
  def dense(p):
    if not isinstance(p, dict) or "kernel_int8" not in p:
      return p
    w_t = quant.dequantize_groups(p["kernel_int8"], p["scale_int8"], p.get("min_int8"))
    return {**{k: v for k, v in p.items() if k not in ("kernel_int8", "scale_int8", "min_int8")}, "kernel": w_t.T}
  out = {k: v for k, v in q.items() if k not in ("layers", "embed_int8", "embed_scale_int8")}
  out["layers"] = [{k: dense(v) for k, v in layer.items()} for layer in q["layers"]]
  out["embed"] = quant.dequantize_groups(q["embed_int8"], q["embed_scale_int8"])
  return out


def test_quantize_groups_by_hand():
  w = jnp.asarray([[0.5, -1.0, 0.25, 0.0], [2.0, 2.0, 2.0, 2.0]], jnp.float32)
  q, s, m = quant.quantize_groups(w, group_size=2)
  # symmetric: group (0.5, -1): scale 1/127, codes round(63.5) = 64 (half to even) and -127;
  # group (0.25, 0): scale 0.25/127, codes 127, 0; group (2, 2): scale 2/127, codes 127, 127.
  assert m is None and q.dtype == jnp.int8
  np.testing.assert_array_equal(np.asarray(q), [[64, -127, 127, 0], [127, 127, 127, 127]])
  np.testing.assert_allclose(np.asarray(s), [[1 / 127, 0.25 / 127], [2 / 127, 2 / 127]], rtol=1e-6)
  q, s, m = quant.quantize_groups(w, group_size=2, affine=True)
  # affine: group (0.5, -1): min -1, scale 1.5/255, codes 255, 0; group (0.25, 0): min 0, scale 0.25/255,
  # codes 255, 0; a constant group (2, 2): scale 1 (range 0), min 2, codes 0, 0 -> exactly 2 again.
  assert q.dtype == jnp.uint8
  np.testing.assert_array_equal(np.asarray(q), [[255, 0, 255, 0], [0, 0, 0, 0]])
  np.testing.assert_allclose(np.asarray(s), [[1.5 / 255, 0.25 / 255], [1.0, 1.0]], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(m), [[-1.0, 0.0], [2.0, 2.0]])
  np.testing.assert_allclose(np.asarray(quant.dequantize_groups(q, s, m)), np.asarray(w), atol=1e-7)


@pytest.mark.parametrize("affine", [False, True])
def test_quantization_error_at_most_half_a_step(affine):
  w = jnp.asarray(np.random.default_rng(0).normal(size=(24, 96)), jnp.float32)
  q, s, m = quant.quantize_groups(w, 32, affine=affine)
  err = np.abs(np.asarray(quant.dequantize_groups(q, s, m)) - np.asarray(w)).reshape(24, 3, 32)
  assert np.all(err <= np.asarray(s)[..., None] / 2 * (1 + 1e-5) + 1e-7)


def test_affine_codes_reproduce_q4_1_blocks():
  """A Q4_1 block is m + k d with k in 0..15; with both end codes present, 255 = 15 x 17 makes the affine
  8-bit grid contain every level (k -> code 17 k), so the block comes back to float32 rounding."""
  rng = np.random.default_rng(1)
  k = rng.integers(0, 16, size=(8, 4, 32))
  k[..., 0], k[..., 1] = 0, 15
  d = rng.uniform(1e-3, 1e-1, size=(8, 4, 1)).astype(np.float32)
  m = rng.normal(size=(8, 4, 1)).astype(np.float32)
  w = (m + k * d).astype(np.float32).reshape(8, 128)
  q, s, mn = quant.quantize_groups(jnp.asarray(w), 32, affine=True)
  np.testing.assert_array_equal(np.asarray(q).reshape(8, 4, 32), 17 * k)
  np.testing.assert_allclose(np.asarray(quant.dequantize_groups(q, s, mn)), w, rtol=1e-6, atol=1e-6)


def test_matmul_paths_against_numpy():
  """One row: float32 x dequantized weights. Several rows: bfloat16-rounded x and weights, float32 sums."""
  rng = np.random.default_rng(2)
  w_t = jnp.asarray(rng.normal(size=(48, 64)), jnp.float32)
  q, s, m = quant.quantize_groups(w_t, 32, affine=True)
  p8 = {"kernel_int8": q, "scale_int8": s, "min_int8": m}
  deq = np.asarray(quant.dequantize_groups(q, s, m), np.float64)
  x1 = rng.normal(size=(1, 1, 64)).astype(np.float32)
  y1 = np.asarray(jax.jit(quant.matmul_t)(jnp.asarray(x1), p8))
  np.testing.assert_allclose(y1, x1.astype(np.float64) @ deq.T, rtol=1e-5, atol=1e-5)
  x3 = rng.normal(size=(3, 64)).astype(np.float32)
  y3 = np.asarray(jax.jit(quant.matmul_t)(jnp.asarray(x3), p8))
  bf = lambda a: np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)  # noqa: E731
  np.testing.assert_allclose(y3, bf(x3) @ bf(deq).T, rtol=1e-5, atol=1e-5)
  pb = {"kernel_bf16": w_t.astype(jnp.bfloat16)}
  np.testing.assert_allclose(np.asarray(jax.jit(quant.matmul_t)(jnp.asarray(x1), pb)),
                             x1.astype(np.float64) @ bf(w_t).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jax.jit(quant.matmul_t)(jnp.asarray(x3), pb)),
                             bf(x3) @ bf(w_t).T, rtol=1e-5, atol=1e-5)
  assert layers.dense(p8, jnp.asarray(x3)).shape == (3, 48)


def test_int8_generation_equals_its_dequantized_float_model(fused):
  """Batch-1 greedy decoding in the int8 format (the fused one-row dot inside the while loop, with
  `bind_to_step`) gives the tokens and log-probabilities of a float32 model holding the same weights."""
  q = quant.convert_params(fused, "int8")
  assert quant.weight_format(q) == "int8" and quant.weight_format(fused) == "float32"
  ref = _dequantized_float(q)
  ids = np.random.default_rng(3).integers(3, 64, (1, 6)).astype(np.int32)
  gen = jax.jit(functools.partial(generation.generate, config=CFG, max_new_tokens=8))
  a = gen(q, prompt_ids=ids, prompt_mask=np.ones_like(ids, bool), key=jax.random.key(0))
  b = gen(ref, prompt_ids=ids, prompt_mask=np.ones_like(ids, bool), key=jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  # the prefill (6 rows) runs in bfloat16 in the int8 format, the steps in float32
  np.testing.assert_allclose(np.asarray(a.logprobs)[:, 1:], np.asarray(b.logprobs)[:, 1:], atol=2e-3)
  bound = quant.bind_to_step(q, jnp.int32(5))
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), bound, q)
  qb = quant.convert_params(fused, "bfloat16")
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
               quant.bind_to_step(qb, jnp.int32(5)), qb)
  out = gen(qb, prompt_ids=ids, prompt_mask=np.ones_like(ids, bool), key=jax.random.key(0))
  assert out.tokens.shape == (1, 8)


def test_weight_bytes_and_errors(fused):
  n_all = llama.num_params(fused)
  n_norm = sum(x.size for k, x in jax.tree_util.tree_leaves_with_path(fused) if "norm" in jax.tree_util.keystr(k))
  assert quant.weight_bytes(fused) == 4 * n_all
  # bfloat16: 2 bytes per kernel / table entry, the norms stay float32
  assert quant.weight_bytes(quant.convert_params(fused, "bfloat16")) == 2 * (n_all - n_norm) + 4 * n_norm
  # int8: 1 byte per entry plus float32 scales per 32 (and a minimum per 32 for the kernels, not the table)
  n_embed = fused["embed"].size
  assert quant.weight_bytes(quant.convert_params(fused, "int8")) == (
      (n_all - n_norm) + 8 * (n_all - n_norm - n_embed) // 32 + 4 * n_embed // 32 + 4 * n_norm)
  with pytest.raises(ValueError, match="weight_format"):
    quant.convert_params(fused, "int4")
  with pytest.raises(ValueError, match="must divide"):
    quant.convert_params(fused, "int8", group_size=48)
  with pytest.raises(ValueError, match="already converted"):
    quant.convert_params(quant.convert_params(fused, "int8"), "bfloat16")
  adapted = lora.init_params(jax.random.key(1), fused, lora.LoraConfig(rank=2, targets=("qkv_proj",)))
  with pytest.raises(ValueError, match="LoRA"):
    quant.convert_params(lora.apply(fused, adapted, lora.LoraConfig(rank=2, targets=("qkv_proj",))), "int8")
  with pytest.raises(ValueError, match="either quantize"):
    generation.Generator(fused, CFG, None, quantize=True, weight_format="int8")


@pytest.mark.parametrize("weight_format", ["float32", "int8"])
def test_batched_decoding_params(fused, weight_format):
  """Several rows per step: the head as a float32 [D, V] table and int8 kernels widened to bfloat16 once.

  The table is the format's own table transposed (float32: the embedding itself; int8: its dequantized
  codes, checked against a numpy dequantization), the widened kernels are exactly the codes' bfloat16
  widening, a two-row forward matches the float32 model holding the same weights, and batch-2 greedy
  decoding through `generate` (which calls it) gives the tokens of that float32 model decoded without a cache.
  """
  p = quant.convert_params(fused, weight_format)
  prep = quant.batched_decoding_params(p)
  head_t = np.asarray(prep["head_t"])
  assert head_t.shape == (CFG.hidden_size, CFG.vocab_size) and head_t.dtype == np.float32
  if weight_format == "float32":
    np.testing.assert_array_equal(head_t, np.asarray(fused["embed"]).T)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
                 prep["layers"], p["layers"])
  else:
    q, s = np.asarray(p["embed_int8"]), np.asarray(p["embed_scale_int8"])
    v, d = q.shape
    table = (q.reshape(v, -1, 32).astype(np.float32) * s[..., None]).reshape(v, d)  # q * scale per 32 inputs
    np.testing.assert_allclose(head_t, table.T, rtol=1e-6, atol=0)
    for old, new in zip(p["layers"], prep["layers"]):
      for name, dense in old.items():
        if isinstance(dense, dict) and "kernel_int8" in dense:
          assert set(new[name]) == {"kernel_bf16"} | (set(dense) - {"kernel_int8", "scale_int8", "min_int8"})
          want = quant.dequantize_groups(dense["kernel_int8"], dense["scale_int8"], dense["min_int8"], jnp.bfloat16)
          np.testing.assert_array_equal(np.asarray(new[name]["kernel_bf16"]), np.asarray(want))
  # The step's logits on the prepared params equal those on the unprepared ones (float32 head either way,
  # same bfloat16 trunk): compare a two-row forward, then generate (which prepares them itself at B > 1).
  ids = np.random.default_rng(4).integers(3, 64, (2, 5)).astype(np.int32)
  fwd = jax.jit(lambda q: llama.forward(q, CFG, ids))
  ref = np.asarray(fwd(_dequantized_float(p) if weight_format == "int8" else p))
  got = np.asarray(fwd(prep))
  # int8: the trunk multiplies bfloat16-rounded activations (as before), so compare within bfloat16 error
  np.testing.assert_allclose(got, ref, atol=1e-5 if weight_format == "float32" else 2e-2)
  gen = jax.jit(functools.partial(generation.generate, config=CFG, max_new_tokens=6))
  a = gen(p, prompt_ids=ids, prompt_mask=np.ones_like(ids, bool), key=jax.random.key(0))
  b = jax.jit(functools.partial(generation.generate, config=CFG, max_new_tokens=6, use_cache=False))(
      _dequantized_float(p) if weight_format == "int8" else p, prompt_ids=ids,
      prompt_mask=np.ones_like(ids, bool), key=jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  stacked_or_w8a8 = llama.quantize_params(fused)
  assert quant.batched_decoding_params(stacked_or_w8a8) is stacked_or_w8a8
