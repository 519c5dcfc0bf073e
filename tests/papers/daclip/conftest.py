"""Fixtures shared by the DA-CLIP test modules: the IR-SDE schedule (cheap: a few
small arrays)."""
import pytest

from iclr24_jax.papers import daclip


@pytest.fixture(scope="module")
def sde():
  return daclip.irsde_schedule(T=100, lambda_=50.0, eps=0.005)
