"""Tiny random decoder-only LMs: shapes, padding, KV cache, layouts, generation, scoring, references."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.lm import generation as gen_lib
from iclr24_jax.lm import llama, scoring, weights

CFG = llama.tiny_config(vocab_size=64)


@pytest.fixture(scope="module")
def params():
  return llama.init_params(jax.random.key(0), CFG)


@pytest.fixture(scope="module")
def fwd():
  return jax.jit(lambda p, ids, mask: llama.forward(p, CFG, ids, mask))


def _ids(b, t, seed=0, vocab=64):
  return np.random.default_rng(seed).integers(3, vocab, (b, t)).astype(np.int32)


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


STOP = CFG.vocab_size - 1  # banned (bias -1e9) unless a test forces it (bias +1e4)


@pytest.fixture(scope="module")
def greedy():
  def run(p, ids, mask, bias, use_cache):
    return gen_lib.generate(p, CFG, ids, mask, jax.random.key(0), max_new_tokens=6, stop_ids=(STOP,), pad_id=0,
                            use_cache=use_cache, logit_bias=bias)
  return jax.jit(run, static_argnames="use_cache")


def _bias(**changes):
  vec = np.zeros((CFG.vocab_size,), np.float32)
  vec[STOP] = -1e9
  for tok, b in changes.items():
    vec[int(tok[1:])] = b
  return vec


def _greedy_ref(params, fwd, prompt, n=6):
  """Greedy continuation by repeated full forwards (row 0 of a right-padded [2, 8] buffer)."""
  seq = list(prompt)
  for _ in range(n):
    buf = np.zeros((2, 8), np.int32)
    m = np.zeros((2, 8), bool)
    buf[0, :len(seq)], m[0, :len(seq)] = seq, True
    logits = np.array(fwd(params, buf, m))[0, len(seq) - 1]
    logits[STOP] = -np.inf
    seq.append(int(np.argmax(logits)))
  return seq[len(prompt):]


def test_generation_cache_equals_no_cache(params, greedy, fwd):
  ids = _ids(2, 8)
  mask = np.ones((2, 8), bool)
  mask[1, :3] = False  # left padding
  a = greedy(params, ids, mask, _bias(), True)
  b = greedy(params, ids, mask, _bias(), False)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), rtol=1e-4, atol=1e-4)
  chex.assert_shape(a.tokens, (2, 6))
  np.testing.assert_array_equal(np.asarray(a.lengths), [6, 6])
  # Prompts of 2 tokens, left- or right-padded: the same continuation, equal to the argmax of plain forwards.
  left = np.zeros((2, 8), bool)
  left[:, -2:] = True
  right = left[:, ::-1].copy()
  ids_right = np.concatenate([ids[:, 6:], ids[:, :6]], axis=1)
  c = greedy(params, ids, left, _bias(), True)
  d = greedy(params, ids_right, right, _bias(), True)
  np.testing.assert_array_equal(np.asarray(c.tokens), np.asarray(d.tokens))
  assert [int(x) for x in np.asarray(c.tokens)[0]] == _greedy_ref(params, fwd, list(ids[0, 6:]))


def test_generation_stop_and_logit_bias(params, greedy):
  """A +1e4 bias on the stop token makes every row emit it first and stop; -1e9 forbids a token."""
  ids = _ids(2, 8)
  mask = np.ones((2, 8), bool)
  out = greedy(params, ids, mask, _bias(**{f"t{STOP}": 1e4}), True)
  np.testing.assert_array_equal(np.asarray(out.tokens), [[STOP, 0, 0, 0, 0, 0]] * 2)
  np.testing.assert_array_equal(np.asarray(out.lengths), [1, 1])
  np.testing.assert_array_equal(np.asarray(out.mask), [[True] + [False] * 5] * 2)
  assert bool(np.all(np.asarray(out.stopped)))
  free = greedy(params, ids, mask, _bias(), True)
  assert not bool(np.any(np.asarray(free.stopped)))
  banned_tok = int(np.asarray(free.tokens)[0, 0])
  banned = greedy(params, ids, mask, _bias(**{f"t{banned_tok}": -1e9}), True)
  assert int(np.asarray(banned.tokens)[0, 0]) != banned_tok
  np.testing.assert_array_equal(gen_lib.bias_vector({3: 2.0, 4: -1.0}, 6), [0, 0, 0, 2.0, -1.0, 0])


def test_sampling_filters():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  filt = jax.jit(gen_lib.process_logits, static_argnames=("temperature", "top_k", "top_p"))
  lp = filt(logits, 1.0, top_k=2)
  np.testing.assert_allclose(np.exp(np.asarray(lp))[0], [0.625, 0.375, 0, 0], rtol=1e-6, atol=1e-7)  # 0.5/0.8, 0.3/0.8
  lp = filt(logits, 1.0, top_p=0.7)  # mass before each: 0, .5, .8 -> keep first two
  np.testing.assert_allclose(np.exp(np.asarray(lp))[0], [0.625, 0.375, 0, 0], rtol=1e-6, atol=1e-7)
  lp = filt(logits, 0.5)  # temperature 0.5 squares the probabilities: p^2 / sum p^2
  p2 = np.asarray([0.25, 0.09, 0.0225, 0.0025])
  np.testing.assert_allclose(np.exp(np.asarray(lp))[0], p2 / p2.sum(), rtol=1e-5)
  keys = jax.random.split(jax.random.key(0), 2000)
  draws = jax.jit(jax.vmap(lambda k: gen_lib.sample_token(k, logits, 1.0)[0][0]))(keys)
  freq = np.bincount(np.asarray(draws), minlength=4) / 2000
  np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.04)  # 4 sigma of a binomial at n=2000
  tok, _ = jax.jit(lambda k: gen_lib.sample_token(k, logits, temperature=1.0, top_k=1))(jax.random.key(1))
  assert int(tok[0]) == 0


def test_nucleus_fast_paths_equal_full_sort():
  """The top-k fast path and the threshold bisection give the full sort's set: sharp rows (nucleus within
  the 16 candidates), a flat row (it is not: the threshold search or the sort runs for the whole batch) and
  rows where no candidate path is taken (candidates >= V)."""
  rng = np.random.default_rng(0)
  sharp = rng.standard_normal((3, 1000)).astype(np.float32) * 6.0
  flat = rng.standard_normal((1, 1000)).astype(np.float32) * 0.1
  ref = jax.jit(lambda l, p: gen_lib.nucleus_mask(l, p, candidates=l.shape[-1], method="sort"),
                static_argnums=1)
  fast = jax.jit(gen_lib.nucleus_mask, static_argnums=(1, 2, 3))
  for logits in (sharp, np.concatenate([sharp, flat]), rng.standard_normal((8, 1000)).astype(np.float32) * 2.0):
    for top_p in (0.3, 0.9, 0.99):
      want = np.asarray(ref(jnp.asarray(logits), top_p))
      for cand, method in ((16, "threshold"), (16, "sort"), (1000, "threshold")):
        got = np.asarray(fast(jnp.asarray(logits), top_p, cand, method))
        np.testing.assert_array_equal(got, want, err_msg=f"{cand} {method} {top_p}")
      assert want.any(1).all()
  assert np.asarray(ref(jnp.asarray(sharp), 0.9)).sum(1).max() <= 16
  # by hand: probabilities .5 .3 .15 .05, top_p .7: mass before = 0, .5, .8 -> the first two; 2 candidates hold .8
  logits = jnp.log(jnp.asarray([[0.15, 0.5, 0.05, 0.3]]))
  for cand in (2, 4):
    np.testing.assert_array_equal(np.asarray(gen_lib.nucleus_mask(logits, 0.7, candidates=cand)), [[0, 1, 0, 1]])
    np.testing.assert_array_equal(np.asarray(gen_lib.nucleus_mask(logits, 0.9, candidates=cand)), [[1, 1, 0, 1]])
  # ties at the boundary: .4 .2 .2 .2, top_p .5 -> the sort keeps .4 and one .2; the threshold keeps every .2
  tied = jnp.log(jnp.asarray([[0.2, 0.4, 0.2, 0.2]]))
  assert int(np.asarray(gen_lib.nucleus_mask(tied, 0.5, candidates=4, method="sort")).sum()) == 2
  np.testing.assert_array_equal(np.asarray(gen_lib.nucleus_mask(tied, 0.5, candidates=4)), [[1, 1, 1, 1]])
  with pytest.raises(ValueError, match="method"):
    gen_lib.nucleus_mask(tied, 0.5, method="heap")


def test_scoring_matches_log_softmax(params, fwd):
  ids = _ids(2, 8)
  mask = np.ones((2, 8), bool)
  mask[1, 5:] = False

  @jax.jit
  def score(p, i, m):
    return (scoring.token_logprobs(p, CFG, i, m), scoring.sequence_logprob(p, CFG, i, m),
            scoring.next_token_logprobs(p, CFG, i, m))

  lp, (s, n), nxt = jax.device_get(score(params, ids, mask))
  logits = np.asarray(fwd(params, ids, mask), np.float64)
  ref = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  for b in range(2):
    for t in range(1, 8):
      want = ref[b, t - 1, ids[b, t]] if mask[b, t] else 0.0
      np.testing.assert_allclose(lp[b, t], want, rtol=1e-5, atol=1e-5)
  assert np.all(lp[:, 0] == 0)
  np.testing.assert_allclose(s, lp.sum(1), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(n, [7, 4])
  np.testing.assert_allclose(nxt[1], ref[1, 4], rtol=1e-5, atol=1e-5)  # row 1's last real token is t=4
  np.testing.assert_allclose(nxt[0], ref[0, 7], rtol=1e-5, atol=1e-5)


def test_scoring_one_vs_eight_devices(params):
  """The same batch sharded over 1 and 8 devices gives the same scores."""
  from iclr24_jax.common import sharding
  ids = _ids(8, 6)
  mask = np.ones((8, 6), bool)
  fn = jax.jit(lambda p, i, m: scoring.token_logprobs(p, CFG, i, m))
  outs = []
  for mesh in sharding.device_meshes((1, 8)):
    batch = sharding.shard_batch((ids, mask), mesh)
    outs.append(np.asarray(fn(sharding.replicate(params, mesh), *batch)))
  np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


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


def test_safetensors_roundtrip(params, tmp_path):
  weights.save_safetensors_llama(params, CFG, tmp_path)
  p2, cfg2 = weights.load_safetensors_llama(tmp_path)
  assert cfg2.replace(head_dim=None) == CFG.replace(max_seq_len=cfg2.max_seq_len)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), p2, params)


def _hf_flat(params_hf, transpose_kernels=True):
  from flax.traverse_util import flatten_dict
  sd = {}
  for k, v in flatten_dict(params_hf, sep=".").items():
    v = np.asarray(v)
    if k.endswith(".kernel"):
      sd[k[:-7] + ".weight"] = v.T if transpose_kernels else v
    elif k.endswith(".embedding"):
      sd[k[:-10] + ".weight"] = v
    elif k.endswith(".scale"):
      sd[k[:-6] + ".weight"] = v
    else:
      sd[k] = v
  return sd


@pytest.mark.slow
def test_matches_transformers_flax_llama_and_gpt2(tmp_path):
  """Our forward equals transformers' Flax Llama (rope base 10000, untied: the settings it handles) and
  Flax GPT-2 with the same random weights."""
  transformers = pytest.importorskip("transformers")
  from safetensors.numpy import save_file
  import json
  ids = _ids(2, 12, vocab=100)
  hc = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                                tie_word_embeddings=False, max_position_embeddings=64, rms_norm_eps=1e-5)
  m = transformers.FlaxLlamaForCausalLM(hc, seed=0)
  save_file({k: np.ascontiguousarray(v) for k, v in _hf_flat(m.params).items()}, str(tmp_path / "model.safetensors"))
  with open(tmp_path / "config.json", "w") as f:
    json.dump(hc.to_dict(), f)
  p, cfg = weights.load_safetensors_llama(tmp_path)
  np.testing.assert_allclose(np.asarray(llama.forward(p, cfg, jnp.asarray(ids))), np.asarray(m(ids).logits),
                             rtol=1e-5, atol=1e-5)
  hc = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)
  m = transformers.FlaxGPT2LMHeadModel(hc, seed=0)
  cfg = weights.gpt2_config_from_hf(hc.to_dict())
  p = weights.convert_hf_gpt2_state_dict(_hf_flat(m.params), cfg)
  np.testing.assert_allclose(np.asarray(llama.forward(p, cfg, jnp.asarray(ids))), np.asarray(m(ids).logits),
                             rtol=1e-5, atol=1e-5)


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


def test_text_helpers_with_trained_tokenizer():
  """score_continuations and Generator (batching, padding rows, bucketing) on a tiny model + trained BPE."""
  from iclr24_jax.lm import corpus, tokenizer as tok_lib
  tok = tok_lib.train_bpe(corpus.TRAIN_TEXTS, vocab_size=300)
  cfg = llama.tiny_config(vocab_size=tok.vocab_size)
  p = llama.init_params(jax.random.key(3), cfg)
  prompts, conts = ["Bees visit", "The moon", "A river"], [" flowers", " orbits the earth", " begins"]
  res = scoring.score_continuations(p, cfg, tok, prompts, conts, batch_size=2)
  np.testing.assert_array_equal(res["num_tokens"], [len(tok.encode(c)) for c in conts])
  np.testing.assert_allclose(res["mean_logprob"], res["sum_logprob"] / res["num_tokens"], rtol=1e-6)
  assert np.all(res["sum_logprob"] < 0)
  alone = scoring.score_continuations(p, cfg, tok, prompts[2:], conts[2:], batch_size=2)
  np.testing.assert_allclose(alone["sum_logprob"], res["sum_logprob"][2:], rtol=1e-5, atol=1e-5)
  ids, mask, tmask = scoring.encode_pairs(tok, prompts[:1], conts[:1])
  assert tmask.sum() == len(tok.encode(conts[0])) and not tmask[0, :len(tok.encode(prompts[0]))].any()
  gen = gen_lib.Generator(p, cfg, tok, chat=False, batch_size=2, stop_ids=())
  texts = gen(prompts, max_new_tokens=5)
  ids_out = gen.generate_ids(prompts, max_new_tokens=5)
  assert len(texts) == 3 and all(len(x) == 5 for x in ids_out)
  assert texts == [tok.decode(x) for x in ids_out]
  assert gen(prompts[:1], max_new_tokens=5)[0] == texts[0]  # batch composition does not change a row
  assert len(gen._compiled) == 1  # one program for all of these calls
  with pytest.raises(TypeError, match="list of prompts"):
    gen("one prompt")
