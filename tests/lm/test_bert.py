"""The BERT encoder (`lm/bert.py`) on the embedded all-MiniLM-L6-v2 (safetensors): paraphrases, pooling
against a reference, the encoder against transformers' Flax BERT (slow). MiniLM is loaded once per module."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.lm import bert, corpus


@pytest.fixture(scope="module")
def minilm():
  try:
    return bert.load_minilm()
  except FileNotFoundError as e:
    pytest.skip(str(e))


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
