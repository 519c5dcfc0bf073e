"""LoRA, causal-LM finetuning steps, and the T5 encoder-decoder."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.lm import llama, lora, t5, train

CFG = llama.tiny_config(vocab_size=64)
LCFG = lora.LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))


@pytest.fixture(scope="module")
def params():
  return llama.init_params(jax.random.key(0), CFG)


def _batch(b=4, t=12, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, CFG.vocab_size, (b, t)).astype(np.int32)
  mask = np.ones((b, t), bool)
  mask[1, 9:] = False
  return {"ids": ids, "mask": mask}


def test_lora_zero_b_equals_base_and_merge_equals_apply(params):
  adapters = lora.init(jax.random.key(1), params, LCFG)
  assert set(adapters) == {f"layers/{i}/{n}" for i in range(CFG.num_layers) for n in ("q_proj", "v_proj", "down_proj")}
  a = adapters["layers/0/q_proj"]
  chex.assert_shape((a["a"], a["b"]), ((CFG.hidden_size, 4), (4, CFG.num_heads * CFG.dim_head)))
  # rank*(in+out) per target: q (32+32), v (32+16), down (64+32) -> 4*(64+48+96)=832 per layer, 2 layers
  assert lora.num_params(adapters) == 2 * 4 * (64 + 48 + 96)
  ids = jnp.asarray(_batch()["ids"])

  @jax.jit
  def outs(p, ad):
    return (llama.forward(p, CFG, ids), llama.forward(lora.apply(p, ad, LCFG), CFG, ids),
            llama.forward(lora.merge(p, ad, LCFG), CFG, ids))

  base, applied, merged = outs(params, adapters)
  np.testing.assert_allclose(np.asarray(applied), np.asarray(base), rtol=1e-6, atol=1e-6)  # B = 0
  nonzero = jax.tree.map(lambda x: x + 0.05, adapters)
  base, applied, merged = outs(params, nonzero)
  assert np.abs(np.asarray(applied) - np.asarray(base)).max() > 1e-3
  np.testing.assert_allclose(np.asarray(merged), np.asarray(applied), rtol=1e-5, atol=1e-5)
  # merge adds (alpha / r) A B to the kernel
  m = lora.merge(params, nonzero, LCFG)
  ab = nonzero["layers/1/v_proj"]
  np.testing.assert_allclose(np.asarray(m["layers"][1]["v_proj"]["kernel"]),
                             np.asarray(params["layers"][1]["v_proj"]["kernel"] + 2.0 * ab["a"] @ ab["b"]),
                             rtol=1e-6, atol=1e-6)


def test_lora_errors(params):
  with pytest.raises(ValueError, match="no dense layer named"):
    lora.init(jax.random.key(0), params, lora.LoraConfig(targets=("query",)))
  with pytest.raises(ValueError, match="fused"):
    lora.init(jax.random.key(0), llama.fuse_params(params), lora.LoraConfig(targets=("q_proj",)))
  with pytest.raises(ValueError, match="rank"):
    lora.LoraConfig(rank=0)


def test_loss_of_uniform_model_is_log_vocab():
  """All-zero weights give zero logits, so every token costs log V: 64 tokens -> log 64 = 4.1589."""
  zero = jax.tree.map(jnp.zeros_like, llama.init_params(jax.random.key(0), CFG))
  loss, metrics = jax.jit(train.causal_lm_loss, static_argnums=1)(zero, CFG, _batch())
  np.testing.assert_allclose(float(loss), math.log(64), atol=1e-4)
  # batch: 4 rows x 12 tokens, row 1 has 9 real tokens; the first token of each row is not predicted:
  # 11 + 8 + 11 + 11 = 41 target tokens
  assert float(metrics["tokens"]) == 41.0


@pytest.mark.parametrize("use_lora", [False, True])
def test_train_step_lowers_loss(params, use_lora):
  chex.clear_trace_counter()  # the two parametrizations build distinct closures of the same code
  batch = _batch()
  tx = optax.adam(1e-2)
  lcfg = LCFG if use_lora else None
  state = train.init_train_state(params, tx, lora_config=lcfg, key=jax.random.key(2))
  step = jax.jit(chex.assert_max_traces(train.make_train_step(CFG, lcfg), n=1))
  losses = []
  for i in range(8):
    state, metrics = step(state, batch, jax.random.key(i))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0] - 0.1, losses
  if use_lora:
    # the base weights are untouched; only the adapters moved
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state.extra["base"], params)
    assert float(jnp.abs(state.params["layers/0/q_proj"]["b"]).max()) > 0
    merged = train.model_params(state, lcfg)
    assert merged["layers"][0]["q_proj"]["kernel"].shape == params["layers"][0]["q_proj"]["kernel"].shape


def test_loss_mask_selects_targets(params):
  """With loss_mask on the last 3 tokens only, the loss equals the mean NLL of those tokens."""
  batch = _batch(b=2, t=8)
  batch["mask"][:] = True
  loss_mask = np.zeros((2, 8), bool)
  loss_mask[:, 5:] = True
  both = jax.jit(lambda p, b: (train.causal_lm_loss(p, CFG, b)[0], llama.forward(p, CFG, b["ids"])))
  loss, logits = both(params, {**batch, "loss_mask": loss_mask})
  logits = np.asarray(logits, np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = -np.mean([logp[b, t - 1, batch["ids"][b, t]] for b in range(2) for t in range(5, 8)])
  np.testing.assert_allclose(float(loss), want, atol=1e-4)


# --------------------------------------------------------------------------------------------------- T5

T5CFG = t5.T5Config(vocab_size=40, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=20)


def test_t5_relative_buckets_by_hand():
  """Bidirectional, 8 buckets, max distance 20: 4 per direction, 2 exact (offsets 0, 1), then log-spaced:
  offset n >= 2 -> 2 + int(log(n / 2) / log(10) * 2), capped at 3; positive offsets add 4."""
  rel = jnp.asarray([-30, -5, -2, -1, 0, 1, 2, 5, 30])
  got = np.asarray(t5.relative_position_bucket(rel, True, 8, 20))
  # |-30|: 2 + int(log 15 / log 10 * 2) = 2 + 2 = 4 -> capped 3; |-5|: 2 + int(0.796) = 2; |-2|: 2; |-1|: 1
  np.testing.assert_array_equal(got, [3, 2, 2, 1, 0, 5, 6, 6, 7])
  # unidirectional (decoder): 8 buckets for the past only, future offsets map to 0
  got = np.asarray(t5.relative_position_bucket(rel, False, 8, 20))
  # max_exact 4: |-5| -> 4 + int(log(5/4)/log(5) * 4) = 4 + 0 = 4; |-30| -> 4 + int(log 7.5 / log 5 * 4) = 4 + 5 -> cap 7
  np.testing.assert_array_equal(got, [7, 4, 2, 1, 0, 0, 0, 0, 0])


def _t5_inputs():
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 40, (2, 10)).astype(np.int32)
  enc_mask = np.ones((2, 10), bool)
  enc_mask[1, 7:] = False
  return enc, enc_mask


def test_t5_training_and_generation():
  """Learn to copy the input (labels = input + EOS) on a fixed batch; then greedy generation copies it."""
  params = t5.init_params(jax.random.key(0), T5CFG)
  enc, _ = _t5_inputs()
  labels = np.concatenate([enc[:, :5], np.ones((2, 1), np.int32)], 1)
  batch = {"inputs": enc[:, :5], "input_mask": np.ones((2, 5), bool), "labels": labels,
           "label_mask": np.ones((2, 6), bool)}
  tx = optax.adam(1e-2)
  opt = tx.init(params)

  @jax.jit
  def step(p, o):
    (loss, _), g = jax.value_and_grad(t5.seq2seq_loss, has_aux=True)(p, T5CFG, batch)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o, loss

  losses = []
  for _ in range(40):
    params, opt, loss = step(params, opt)
    losses.append(float(loss))
  assert losses[-1] < 0.1 * losses[0], losses[::10]
  out = jax.jit(lambda p, e: t5.generate(p, T5CFG, e, None, jax.random.key(0), max_new_tokens=8))(params, enc[:, :5])
  chex.assert_shape(out.tokens, (2, 8))
  np.testing.assert_array_equal(np.asarray(out.tokens)[:, :6], labels)  # the copy, then EOS (id 1)
  np.testing.assert_array_equal(np.asarray(out.lengths), [6, 6])
  assert bool(np.all(np.asarray(out.stopped)))


@pytest.mark.slow
def test_t5_generation_cache_equals_no_cache():
  params = t5.init_params(jax.random.key(0), T5CFG)
  enc, enc_mask = _t5_inputs()
  gen = jax.jit(lambda p, e, m, c: t5.generate(p, T5CFG, e, m, jax.random.key(0), max_new_tokens=6, stop_ids=(),
                                               use_cache=c), static_argnums=3)
  a, b = gen(params, enc, enc_mask, True), gen(params, enc, enc_mask, False)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


@pytest.mark.slow
def test_t5_matches_transformers_flax():
  """Same random weights in transformers' Flax T5 (v1.0 tied/relu and v1.1 untied/gated-gelu): same logits."""
  transformers = pytest.importorskip("transformers")
  from flax.traverse_util import flatten_dict
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 100, (2, 30))
  em = np.ones((2, 30), bool)
  em[1, 20:] = False
  dec = rng.integers(2, 100, (2, 25))
  dec[:, 0] = 0
  for ff, tie in (("relu", True), ("gated-gelu", False)):
    hc = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3,
                               num_heads=4, feed_forward_proj=ff, tie_word_embeddings=tie, dropout_rate=0.0,
                               relative_attention_num_buckets=8, relative_attention_max_distance=20)
    m = transformers.FlaxT5ForConditionalGeneration(hc, seed=0)
    sd = {}
    for k, v in flatten_dict(m.params, sep=".").items():
      v = np.asarray(v)
      sd[k[:-7] + ".weight" if k.endswith(".kernel") else (k[:-10] + ".weight" if k.endswith(".embedding") else k)] = (
          v.T if k.endswith(".kernel") else v)
    cfg = t5.config_from_hf(hc.to_dict())
    params = t5.convert_hf_state_dict(sd, cfg)
    ref = np.asarray(m(input_ids=enc, attention_mask=em.astype("i4"), decoder_input_ids=dec).logits)
    ours = np.asarray(t5.forward(params, cfg, jnp.asarray(enc), jnp.asarray(em), jnp.asarray(dec)))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
    out = t5.generate(params, cfg, jnp.asarray(enc), jnp.asarray(em), jax.random.key(0), 8, stop_ids=(1,))
    hf = np.asarray(m.generate(enc, attention_mask=em.astype("i4"), max_new_tokens=8, do_sample=False, eos_token_id=1,
                               pad_token_id=0, decoder_start_token_id=0).sequences)[:, 1:]
    for row in range(2):
      n = int(out.lengths[row])
      np.testing.assert_array_equal(np.asarray(out.tokens)[row, :n], hf[row, :n])
