"""D2 Pruning text embedder (`papers/d2pruning/text.py`): optional, with a clear error when absent."""
import chex
import pytest


def test_text_embedder_optional():
  from iclr24_jax.papers.d2pruning import text
  try:
    embed = text.load_text_embedder()
  except text.TextEmbedderUnavailable as e:
    pytest.skip(f"lm core MiniLM embedder unavailable: {e}")
  emb = embed(["Can a cat swim?", "Is the sky green?"])
  chex.assert_shape(emb, (2, 384))
