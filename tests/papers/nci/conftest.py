"""Fixtures shared by the NCI test modules."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.papers import nci
from iclr24_jax.papers.nci import model as model_lib
from .helpers import B, K, S


@pytest.fixture(scope="session")
def setup():
  import ml_collections
  cfg = ml_collections.ConfigDict(dict(name="mnist_cnn", widths=(8, 8), discriminator="linear"))
  nets = model_lib.make_networks(cfg, 10, K)
  tx = optax.adam(1e-2)
  state = nci.init(jax.random.key(0), nets, (S, S, 1), tx, tx)
  rng = np.random.default_rng(0)
  src = {"x": jnp.asarray(rng.random((K, B, S, S, 1), np.float32)),
         "y": jnp.asarray(rng.integers(0, 10, (K, B)), jnp.int32)}
  tgt = jnp.asarray(rng.random((B, S, S, 1), np.float32))
  return nets, state, src, tgt
