"""The T5 encoder-decoder: bucketed relative positions, input embeddings, decoder prefixes, training through
`lm.train` (full and LoRA), eval steps, tokenizer-derived special ids, and the transformers comparison (slow)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.lm import corpus, lora, t5, tokenizer, train

T5CFG = t5.T5Config(vocab_size=40, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=20)


@pytest.fixture(scope="module")
def params():
  return t5.init_params(jax.random.key(0), T5CFG)


def _t5_inputs():
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 40, (2, 10)).astype(np.int32)
  enc_mask = np.ones((2, 10), bool)
  enc_mask[1, 7:] = False
  return enc, enc_mask


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


def test_encode_from_embeddings_equals_encode_from_ids(params):
  """encode(embeds=embedding(ids)) == encode(ids), with padding; forward and the loss take embeddings too."""
  enc, enc_mask = _t5_inputs()
  labels = np.asarray([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)
  label_mask = np.asarray([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
  batch = {"inputs": enc, "input_mask": enc_mask, "labels": labels, "label_mask": label_mask}

  @jax.jit
  def both(p):
    emb = jnp.take(p["shared"], jnp.asarray(enc), axis=0)
    no_ids = {k: v for k, v in batch.items() if k != "inputs"}
    return (t5.encode(p, T5CFG, enc, enc_mask), t5.encode(p, T5CFG, mask=enc_mask, embeds=emb),
            t5.seq2seq_loss(p, T5CFG, batch)[0], t5.seq2seq_loss(p, T5CFG, no_ids, input_embeds=emb)[0],
            t5.seq2seq_loss(p, T5CFG, {**no_ids, "input_embeds": emb.at[0, 0].add(1.0)})[0])

  from_ids, from_emb, loss_ids, loss_emb, moved = both(params)
  chex.assert_shape(from_emb, (2, 10, T5CFG.d_model))
  np.testing.assert_allclose(np.asarray(from_emb), np.asarray(from_ids), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(float(loss_emb), float(loss_ids), rtol=1e-6)
  # the embeddings are really used (batch['input_embeds'] too): perturbing one real input changes the loss
  assert abs(float(moved) - float(loss_ids)) > 1e-4


def test_generate_with_prefix_starts_with_it(params):
  """The output starts with the prefix; the first new token is the argmax of the teacher-forced logits after
  [start, prefix]; the KV-cache path equals the recompute path; enc_embeds gives the same tokens as ids."""
  enc, enc_mask = _t5_inputs()
  prefix = np.asarray([[11, 12], [13, 14]], np.int32)
  n = 5

  @jax.jit
  def run(p):
    emb = jnp.take(p["shared"], jnp.asarray(enc), axis=0)
    key = jax.random.key(0)
    with_cache = t5.generate(p, T5CFG, enc, enc_mask, key, n, stop_ids=(), decoder_prefix=prefix)
    no_cache = t5.generate(p, T5CFG, enc, enc_mask, key, n, stop_ids=(), decoder_prefix=prefix, use_cache=False)
    from_emb = t5.generate(p, T5CFG, None, enc_mask, key, n, stop_ids=(), decoder_prefix=prefix, enc_embeds=emb)
    head = jnp.concatenate([jnp.zeros((2, 1), jnp.int32), jnp.asarray(prefix)], axis=1)  # [start=pad 0, prefix]
    tf = t5.forward(p, T5CFG, enc, enc_mask, head)[:, -1]
    return with_cache, no_cache, from_emb, tf

  out, ref, from_emb, tf = run(params)
  chex.assert_shape((out.tokens, out.mask, out.logprobs), ((2, 2 + n),) * 3)
  tokens = np.asarray(out.tokens)
  np.testing.assert_array_equal(tokens[:, :2], prefix)
  np.testing.assert_array_equal(np.asarray(out.mask), True)
  np.testing.assert_array_equal(np.asarray(out.lengths), [2 + n, 2 + n])
  np.testing.assert_array_equal(np.asarray(out.logprobs)[:, :2], 0.0)
  np.testing.assert_array_equal(tokens[:, 2], np.argmax(np.asarray(tf), -1))
  np.testing.assert_array_equal(np.asarray(ref.tokens), tokens)
  np.testing.assert_array_equal(np.asarray(from_emb.tokens), tokens)


def test_prefix_steers_a_trained_model():
  """Train with a control token after the decoder start: [control, copy or reverse of the input, EOS], the
  control token not learned (loss_mask). Then generate with each prefix: it follows the control token."""
  rng = np.random.default_rng(1)
  inputs = rng.integers(5, 40, (16, 4)).astype(np.int32)
  copy_tok, rev_tok = 2, 3
  targets = np.concatenate([inputs, inputs[:, ::-1]], 0)
  control = np.asarray([copy_tok] * 16 + [rev_tok] * 16, np.int32)[:, None]
  labels = np.concatenate([control, targets, np.ones((32, 1), np.int32)], 1)  # [control, 4 tokens, EOS=1]
  loss_mask = np.ones(labels.shape, bool)
  loss_mask[:, 0] = False
  batch = {"inputs": np.concatenate([inputs, inputs], 0), "labels": labels, "loss_mask": loss_mask}
  tx = optax.adam(1e-2)
  state = train.init_train_state(t5.init_params(jax.random.key(3), T5CFG), tx)
  step = jax.jit(chex.assert_max_traces(train.make_train_step(T5CFG), n=1))
  chex.clear_trace_counter()
  for i in range(150):
    state, metrics = step(state, batch, jax.random.key(i))
  assert float(metrics["accuracy"]) == 1.0, metrics
  assert float(metrics["tokens"]) == 32 * 5  # the control token is not counted
  gen = jax.jit(lambda p, e, pre: t5.generate(p, T5CFG, e, None, jax.random.key(0), 6, decoder_prefix=pre))
  for tok, want in ((copy_tok, inputs[:4]), (rev_tok, inputs[:4, ::-1])):
    out = gen(state.params, inputs[:4], np.full((4, 1), tok, np.int32))
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, 0], tok)
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, 1:5], want)
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, 5], 1)  # EOS
    np.testing.assert_array_equal(np.asarray(out.lengths), 6)


def test_eval_step_and_lora_train_step_work_for_t5(params):
  """make_eval_step's default loss for a T5Config is seq2seq_loss; LoRA on ('q', 'v') trains through
  make_train_step and leaves the base untouched."""
  enc, enc_mask = _t5_inputs()
  labels = np.concatenate([enc[:, :5], np.ones((2, 1), np.int32)], 1)
  batch = {"inputs": enc, "input_mask": enc_mask, "labels": labels}
  state = train.init_train_state(params, optax.adam(1e-2))
  got = jax.jit(train.make_eval_step(T5CFG))(state, batch)
  want = jax.jit(lambda p: t5.seq2seq_loss(p, T5CFG, batch)[1])(params)
  for k in ("loss", "accuracy", "tokens"):
    np.testing.assert_allclose(float(got[k]), float(want[k]), rtol=1e-6)
  lcfg = lora.LoraConfig(rank=4, alpha=8.0, targets=("q", "v"))
  state = train.init_train_state(params, optax.adam(3e-2), lora_config=lcfg, key=jax.random.key(1))
  assert len(state.params) == 2 * 2 + 2 * 2 * 2  # encoder: self q, v; decoder: self + cross q, v (2 layers each)
  step = jax.jit(train.make_train_step(T5CFG, lcfg))
  ev = jax.jit(train.make_eval_step(T5CFG, lcfg))
  before = float(ev(state, batch)["loss"])
  np.testing.assert_allclose(before, float(want["loss"]), rtol=1e-6)  # B = 0: the base model's loss
  for i in range(10):
    state, _ = step(state, batch, jax.random.key(i))
  assert float(ev(state, batch)["loss"]) < before - 0.1
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state.extra["base"], params)


def test_config_from_tokenizer():
  """train_bpe gives pad 0, BOS 1, EOS 2 (T5's own vocabulary has EOS 1): the config follows the tokenizer."""
  tok = tokenizer.train_bpe(corpus.TRAIN_TEXTS, vocab_size=300)
  cfg = t5.T5Config.from_tokenizer(tok, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
  assert (cfg.pad_id, cfg.eos_id, cfg.decoder_start_id) == (tok.pad_id, tok.eos_id, tok.pad_id) == (0, 2, 0)
  assert cfg.vocab_size == tok.vocab_size
  assert t5.T5Config.from_tokenizer(tok, decoder_start="bos").decoder_start_id == 1
  assert t5.T5Config.from_tokenizer(tok, vocab_size=384).vocab_size == 384
  with pytest.raises(ValueError, match="smaller than the tokenizer"):
    t5.T5Config.from_tokenizer(tok, vocab_size=100)
  with pytest.raises(ValueError, match="from_tokenizer sets eos_id"):
    t5.T5Config.from_tokenizer(tok, eos_id=1)
  with pytest.raises(ValueError, match="outside the vocabulary"):
    t5.T5Config(vocab_size=40, eos_id=40)


def test_clear_errors(params):
  enc, _ = _t5_inputs()
  emb = jnp.zeros((2, 10, T5CFG.d_model))
  with pytest.raises(ValueError, match="exactly one"):
    t5.encode(params, T5CFG, enc, embeds=emb)
  with pytest.raises(ValueError, match="exactly one"):
    t5.encode(params, T5CFG)
  with pytest.raises(ValueError, match="d_model=32"):
    t5.encode(params, T5CFG, embeds=jnp.zeros((2, 10, 7)))
  with pytest.raises(ValueError, match="mask must be"):
    t5.encode(params, T5CFG, enc, np.ones((2, 9), bool))
  with pytest.raises(ValueError, match="decoder_prefix must be"):
    t5.generate(params, T5CFG, enc, None, jax.random.key(0), 2, decoder_prefix=np.zeros((3, 1), np.int32))
  with pytest.raises(ValueError, match="neither 'inputs'"):
    t5.seq2seq_loss(params, T5CFG, {"labels": enc})


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
