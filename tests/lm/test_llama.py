"""The decoder-only LM (`lm/llama.py`) on tiny random models: shapes, padding, causality, the KV
cache, fused params, RoPE layouts, the GPT-2 config, int8 weights, clear errors."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.lm import generation as gen_lib
from iclr24_jax.lm import llama, weights
from .helpers import CFG, _ids


def test_shapes_and_dtypes(params, fwd):
  ids = _ids(3, 10)
  logits = fwd(params, ids, np.ones((3, 10), bool))
  chex.assert_shape(logits, (3, 10, CFG.vocab_size))
  assert logits.dtype == jnp.float32
  hidden = jax.eval_shape(lambda p, i: llama.hidden_states(p, CFG, i), params, ids)
  chex.assert_shape(hidden, (3, 10, CFG.hidden_size))
  assert llama.num_params(params) == sum(x.size for x in jax.tree.leaves(params))


def test_padding_does_not_change_real_tokens(params, fwd):
  """Right and left padding (and garbage ids in padded slots) leave the real tokens' logits unchanged."""
  ids = _ids(1, 7)
  ref = np.asarray(fwd(params, ids, np.ones((1, 7), bool)))[0]
  junk = _ids(1, 5, seed=1)
  right = np.concatenate([ids, junk], 1)
  right_mask = np.concatenate([np.ones((1, 7), bool), np.zeros((1, 5), bool)], 1)
  left = np.concatenate([junk, ids], 1)
  left_mask = right_mask[:, ::-1].copy()
  out_r = np.asarray(fwd(params, right, right_mask))[0, :7]
  out_l = np.asarray(fwd(params, left, left_mask))[0, 5:]
  np.testing.assert_allclose(out_r, ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out_l, ref, rtol=1e-5, atol=1e-5)


def test_causality(params, fwd):
  ids = _ids(1, 8)
  ids2 = ids.copy()
  ids2[0, 5:] = (ids2[0, 5:] + 1) % CFG.vocab_size
  a = np.asarray(fwd(params, ids, np.ones((1, 8), bool)))
  b = np.asarray(fwd(params, ids2, np.ones((1, 8), bool)))
  np.testing.assert_allclose(a[0, :5], b[0, :5], rtol=1e-6, atol=1e-6)
  assert np.abs(a[0, 5:] - b[0, 5:]).max() > 1e-4


def test_cache_matches_full_forward(params, fwd):
  """Prefill 5 tokens into a cache, then feed 3 one by one: logits equal the no-cache forward."""
  ids = _ids(2, 8)
  full = np.asarray(fwd(params, ids, np.ones((2, 8), bool)))
  cache = llama.init_cache(CFG, 2, 12)
  step = jax.jit(lambda p, i, m, c: llama.forward(p, CFG, i, m, cache=c))
  logits, cache = step(params, ids[:, :5], np.ones((2, 5), bool), cache)
  outs = [np.asarray(logits)]
  for t in range(5, 8):
    logits, cache = step(params, ids[:, t:t + 1], np.ones((2, 1), bool), cache)
    outs.append(np.asarray(logits))
  np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5)
  assert int(cache.index) == 8 and np.all(np.asarray(cache.length) == 8)


def test_fused_params_same_outputs(params, fwd):
  ids = _ids(2, 8)
  a = fwd(params, ids, np.ones((2, 8), bool))
  b = fwd(llama.fuse_params(params), ids, np.ones((2, 8), bool))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
  assert "qkv_proj" in llama.fuse_params(params)["layers"][0]


def test_rope_layouts_are_a_row_permutation(params, fwd):
  """'interleaved' rope on GGUF-permuted q/k rows equals 'half' rope on the original rows."""
  def permute(w, n_heads):  # llama.cpp's convert permutation (HF -> GGUF), on [out, in] rows
    out_dim, in_dim = w.shape
    return w.reshape(n_heads, 2, out_dim // n_heads // 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)
  inter = jax.tree.map(lambda x: x, params)
  for layer in inter["layers"]:
    layer["q_proj"] = {"kernel": jnp.asarray(permute(np.asarray(layer["q_proj"]["kernel"]).T, CFG.num_heads).T)}
    layer["k_proj"] = {"kernel": jnp.asarray(permute(np.asarray(layer["k_proj"]["kernel"]).T, CFG.num_kv_heads).T)}
  ids = _ids(2, 8)
  a = fwd(params, ids, np.ones((2, 8), bool))
  b = jax.jit(lambda p, i: llama.forward(p, CFG.replace(rope_layout="interleaved"), i))(inter, ids)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
  # and the un-permutation used by the GGUF loader inverts it
  w = np.random.default_rng(0).normal(size=(CFG.num_heads * CFG.dim_head, 5))
  np.testing.assert_array_equal(weights.unpermute_rope_rows(permute(w, CFG.num_heads), CFG.num_heads), w)
  # the two layouts rotate different coordinate pairs: mixing them is not a no-op
  x = jax.random.normal(jax.random.key(2), (1, 4, 2, 8))
  cos, sin = llama.rope_tables(jnp.arange(4)[None], 8, 10000.0)
  assert np.abs(np.asarray(llama.apply_rope(x, cos, sin, "half") - llama.apply_rope(x, cos, sin, "interleaved"))).max() > 0.1


def test_gpt2_config_runs_and_caches():
  cfg = llama.gpt2_config(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, max_seq_len=32)
  p = llama.init_params(jax.random.key(1), cfg)
  ids = jnp.asarray(_ids(2, 8, vocab=50))

  @jax.jit
  def both(p, ids):
    full = llama.forward(p, cfg, ids)
    a, cache = llama.forward(p, cfg, ids[:, :5], cache=llama.init_cache(cfg, 2, 8))
    b, _ = llama.forward(p, cfg, ids[:, 5:], cache=cache)
    return full, jnp.concatenate([a, b], 1)

  full, inc = both(p, ids)
  np.testing.assert_allclose(np.asarray(inc), np.asarray(full), rtol=1e-5, atol=1e-5)
  assert "pos_embed" in p and "bias" in p["layers"][0]["q_proj"]


def test_clear_errors(params):
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    llama.LlamaConfig(num_heads=9, num_kv_heads=4)
  with pytest.raises(ValueError, match="rope_layout"):
    llama.LlamaConfig(rope_layout="sideways")
  with pytest.raises(ValueError, match=r"\[batch, time\]"):
    llama.forward(params, CFG, jnp.zeros((4,), jnp.int32))
  with pytest.raises(ValueError, match="max_seq_len"):
    gen_lib.generate(params, CFG, jnp.zeros((1, 250), jnp.int32), jnp.ones((1, 250), bool), jax.random.key(0),
                     max_new_tokens=10)
  with pytest.raises(ValueError, match="top_p"):
    gen_lib.generate(params, CFG, jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), bool), jax.random.key(0),
                     max_new_tokens=2, top_p=0.0)
  with pytest.raises(ValueError, match="outside the vocabulary"):
    gen_lib.bias_vector({1000: 1.0}, CFG.vocab_size)
  with pytest.raises(FileNotFoundError, match="GGUF"):
    weights.find_smollm2_gguf("/nonexistent/model.gguf")


def test_int8_quantization_error_bounds(params):
  """Per-row int8: |w - q s| <= s / 2 elementwise; the W8A8 matmul error obeys the triangle bound
  sum_i |x_i| s_w / 2 + |w_i| s_x / 2 + s_x s_w / 4 per output."""
  from iclr24_jax.lm import layers
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(16, 40)), jnp.float32)
  q, s = layers.quantize_rows(w)
  assert q.dtype == jnp.int8 and s.shape == (16,)
  assert np.all(np.abs(np.asarray(w) - np.asarray(q, np.float32) * np.asarray(s)[:, None]) <= np.asarray(s)[:, None] / 2 + 1e-7)
  x = jnp.asarray(rng.normal(size=(3, 40)), jnp.float32)
  y = np.asarray(layers.int8_matmul(x, q, s))
  exact = np.asarray(x) @ np.asarray(w).T
  sx = np.abs(np.asarray(x)).max(1, keepdims=True) / 127
  bound = (np.abs(np.asarray(x)) @ np.ones((40, 16)) * np.asarray(s) / 2 + sx * (np.abs(np.asarray(w)).sum(1)) / 2
           + 40 * sx * np.asarray(s) / 4)
  assert np.all(np.abs(y - exact) <= bound + 1e-5)
  qp = llama.quantize_params(llama.fuse_params(params))
  assert qp["layers"][0]["qkv_proj"]["qkernel"].dtype == jnp.int8 and "embed" not in qp
  out = jax.jit(lambda p, i: llama.forward(p, CFG, i))(qp, _ids(2, 8))
  chex.assert_shape(out, (2, 8, CFG.vocab_size))
  chex.assert_tree_all_finite(out)
