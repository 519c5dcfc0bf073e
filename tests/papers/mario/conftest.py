"""Fixtures shared by the MARIO test modules."""
import jax
import pytest

from iclr24_jax.lm import llama
from iclr24_jax.lm import tokenizer as tok_lib
from .helpers import CFG, TEXTS


@pytest.fixture(scope="session")
def tok():
  t = tok_lib.train_bpe(TEXTS + ["<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"], vocab_size=300,
                        special_tokens=tok_lib.TRAIN_SPECIALS + ("<|im_start|>", "<|im_end|>"))
  import dataclasses
  return dataclasses.replace(t, eos_id=t.backend.token_to_id("<|im_end|>"))


@pytest.fixture(scope="session")
def params():
  return llama.init_params(jax.random.key(0), CFG)
