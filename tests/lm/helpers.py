"""Shared by the LM family's test modules: the tiny Llama config, random ids, a LoRA config and a batch."""
import numpy as np

from iclr24_jax.lm import llama, lora


CFG = llama.tiny_config(vocab_size=64)


def _ids(b, t, seed=0, vocab=64):
  return np.random.default_rng(seed).integers(3, vocab, (b, t)).astype(np.int32)


LCFG = lora.LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))


def _batch(b=4, t=12, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, CFG.vocab_size, (b, t)).astype(np.int32)
  mask = np.ones((b, t), bool)
  mask[1, 9:] = False
  return {"ids": ids, "mask": mask}
