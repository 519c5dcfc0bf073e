"""Fixtures shared by the LM family's test modules: the tiny Llama's params and its compiled forward (one
per session). `test_scale.py` and `test_t5.py` define their own `params` (a 3-layer Llama, a T5)."""
import jax
import pytest

from iclr24_jax.lm import llama
from .helpers import CFG


@pytest.fixture(scope="session")
def params():
  return llama.init_params(jax.random.key(0), CFG)


@pytest.fixture(scope="session")
def fwd():
  return jax.jit(lambda p, ids, mask: llama.forward(p, CFG, ids, mask))
