"""The embedded pretrained models: SmolLM2-135M-Instruct (GGUF) and all-MiniLM-L6-v2 (safetensors).

One module-scoped load each. Expected figures for a correct SmolLM2 forward come from
shared/notes/smollm2-offline.md: the chat answer "The capital of France is Paris.", a natural sentence
about -3.7 nats/token against about -8.4 for the same words shuffled, and a long paragraph about -2.4
(a wrong rope layout still answers "Paris" but falls to about -4.5 on long text).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.lm import bert, corpus, generation, llama, scoring, weights


@pytest.fixture(scope="module")
def smol():
  try:
    return weights.load_smollm2()
  except FileNotFoundError as e:
    pytest.skip(str(e))


@pytest.fixture(scope="module")
def minilm():
  try:
    return bert.load_minilm()
  except FileNotFoundError as e:
    pytest.skip(str(e))


def test_smollm2_config(smol):
  params, config, tok = smol
  assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (30, 576, 9, 3)
  assert config.rope_base == 100000.0 and config.tie_embeddings and config.rope_layout == "half"
  assert "lm_head" not in params and params["embed"].shape == (49152, 576)
  assert 134e6 < llama.num_params(params) < 136e6  # SmolLM2-135M


def test_smollm2_answers_paris(smol):
  params, config, tok = smol
  gen = generation.Generator(params, config, tok, batch_size=1)
  assert gen(["What is the capital of France?"], max_new_tokens=12) == ["The capital of France is Paris."]


def test_smollm2_scores_natural_text(smol):
  """Natural > shuffled by a wide margin, and the long paragraph's mean log-likelihood is where a correct
  forward puts it (notes: -2.4 right vs -4.5 with the wrong rope layout; we accept > -3.5, the midpoint)."""
  params, config, tok = smol
  texts = [corpus.NATURAL_SENTENCE, corpus.SHUFFLED_SENTENCE, corpus.LONG_PARAGRAPH]
  ids, mask = tok.encode_batch(texts, pad_to_multiple=64)
  assert mask[2].sum() >= 100  # the paragraph is long (100+ tokens)
  fn = jax.jit(functools.partial(scoring.sequence_logprob, config=config))
  total, count = jax.device_get(fn(params, ids=ids, mask=mask))
  mean = total / count
  assert mean[0] > mean[1] + 2.0, mean  # notes: -3.7 vs -8.4
  assert -3.5 < mean[2] < -1.5, mean


def test_minilm_paraphrase_beats_unrelated(minilm):
  params, config, tok = minilm
  emb = bert.embed_sentences(params, config, tok, [a for pair in corpus.PARAPHRASES for a in pair] +
                             list(corpus.UNRELATED))
  assert emb.shape == (2 * len(corpus.PARAPHRASES) + len(corpus.UNRELATED), 384) and emb.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
  k = len(corpus.PARAPHRASES)
  para = [float(emb[2 * i] @ emb[2 * i + 1]) for i in range(k)]
  unrelated = [float(emb[2 * i] @ emb[2 * k + i]) for i in range(k)]
  assert min(para) > max(unrelated), (para, unrelated)


def test_minilm_pooling_matches_reference(minilm):
  """sentence-transformers pooling for this model: masked mean of the last hidden states, then L2 norm."""
  params, config, tok = minilm
  texts = ["A man is playing a guitar.", "Short.", "Another, somewhat longer sentence about the weather today."]
  ids, mask = bert.encode_texts(tok, texts)
  ours = np.asarray(jax.jit(functools.partial(bert.encode, config=config))(params, ids=ids, mask=mask))
  emb = bert.embed_sentences(params, config, tok, texts)
  m = mask[..., None].astype(np.float64)
  pooled = (ours * m).sum(1) / m.sum(1)
  np.testing.assert_allclose(emb, pooled / np.linalg.norm(pooled, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
  # a text's embedding does not depend on the other texts in its batch (padding)
  np.testing.assert_allclose(bert.embed_sentences(params, config, tok, texts[1:2]), emb[1:2], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_minilm_encoder_matches_transformers_flax_bert(minilm):
  """Our BERT equals transformers' FlaxBertModel on the same safetensors."""
  transformers = pytest.importorskip("transformers")
  params, config, tok = minilm
  ids, mask = bert.encode_texts(tok, ["A man is playing a guitar.", "Short."])
  ours = np.asarray(bert.encode(params, config, jnp.asarray(ids), jnp.asarray(mask)))
  ref = transformers.FlaxBertModel.from_pretrained(str(bert.find_minilm()))
  hidden = np.asarray(ref(input_ids=ids, attention_mask=mask.astype("i4")).last_hidden_state)
  np.testing.assert_allclose(ours[mask], hidden[mask], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_smollm2_wrong_rope_layout_doubles_loss(smol):
  params, config, tok = smol
  ids, mask = tok.encode_batch([corpus.LONG_PARAGRAPH])
  right = scoring.sequence_logprob(params, config, ids, mask)
  wrong = scoring.sequence_logprob(params, config.replace(rope_layout="interleaved"), ids, mask)
  r, w = float(right[0][0] / right[1][0]), float(wrong[0][0] / wrong[1][0])
  assert w < r - 1.0, (r, w)


@pytest.mark.slow
def test_smollm2_matches_torch_transformers_on_same_gguf(smol):
  """transformers (PyTorch) dequantizes the same GGUF: the weights are identical, so logits agree to float32
  summation noise. Skipped when torch is not installed (it is not a dependency)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  params, config, tok = smol
  path = weights.find_smollm2_gguf()
  model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            torch_dtype=torch.float32)
  ids = tok.encode(corpus.LONG_PARAGRAPH)[:64]
  with torch.no_grad():
    ref = model(torch.tensor([ids])).logits.numpy()
  ours = np.asarray(llama.forward(params, config, jnp.asarray([ids])))
  np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=2e-3)


def test_smollm2_compact_formats_match_float32_logprobs(smol):
  """The paragraph's per-token log-probabilities in the int8 and bfloat16 formats against float32: decoding
  one token at a time (the one-row path of batch-1 generation), scoring all rows in one call (the
  bfloat16 matmul path), and the weights as batched decoding lays them out (`batched_decoding_params`). Mean |difference| < 0.02 nats. The int8 codes hold the GGUF's Q4_1
  blocks (nearly) exactly, so one-row int8 decoding is within 1e-3 of float32 on average."""
  from iclr24_jax.lm import quant
  params, config, tok = smol
  fused = llama.fuse_params(params)
  ids, mask = tok.encode_batch([corpus.LONG_PARAGRAPH])
  t = ids.shape[1]

  def one_by_one(p, ids):
    def body(cache, tok_t):
      logits, cache = llama.forward(p, config, tok_t[None, None], jnp.ones((1, 1), bool), cache=cache,
                                    last_only=True)
      return cache, jax.nn.log_softmax(logits[0])
    _, lps = jax.lax.scan(body, llama.init_cache(config, 1, t), ids[0])
    return jnp.take_along_axis(lps[:-1], ids[0, 1:, None], axis=1)[:, 0]

  full = jax.jit(lambda p: scoring.token_logprobs(p, config, ids, mask)[0, 1:])
  stepwise = jax.jit(one_by_one)
  ref = np.asarray(full(fused))
  int8 = quant.convert_params(fused, "int8")
  diffs = {"int8 one row": np.abs(np.asarray(stepwise(int8, ids)) - ref).mean(),
           "int8 all rows": np.abs(np.asarray(full(int8)) - ref).mean(),
           "bfloat16 all rows": np.abs(np.asarray(full(quant.convert_params(fused, "bfloat16"))) - ref).mean(),
           # what batched decoding (B > 1) runs: bfloat16-widened kernels and a float32 [D, V] head
           "int8 batched decoding": np.abs(np.asarray(full(quant.batched_decoding_params(int8))) - ref).mean()}
  assert all(d < 0.02 for d in diffs.values()), diffs
  assert diffs["int8 one row"] < 1e-3, diffs
