"""Fixtures shared by the diffusion family's test modules: a small MLP denoiser and its state (one per
session: ~1.5 s to build, used by the unet and train tests), the 2-D ring and an 8-D mixture, the
linear and cosine schedules (cheap)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import schedules, train, unet
from .helpers import _fast_jit


@pytest.fixture(scope="session")
def mlp_setup():
  """A small MLP denoiser on [B, 2, 3] data with class labels (3 classes) and a vector condition, and its state."""
  model = unet.MLPDenoiser(hidden=16, num_blocks=2, time_embed_dim=8, num_classes=3)
  rng = np.random.default_rng(0)
  batch = {"x": rng.standard_normal((16, 2, 3)).astype(np.float32), "y": (np.arange(16) % 3).astype(np.int32),
           "cond": rng.standard_normal((16, 2)).astype(np.float32)}
  st = _fast_jit(lambda k: train.init(k, model, (2, 3), optax.adam(1e-2), class_labels=jnp.zeros((1,), int),
                                               cond=jnp.zeros((1, 2))), jax.random.key(0))(jax.random.key(0))
  return model, st, batch


@pytest.fixture(scope="module")
def ring():
  return gmm_lib.ring_gmm()


@pytest.fixture(scope="module")
def gmm8():
  return gmm_lib.make_gmm(jax.random.key(8), 8, 4)


@pytest.fixture(scope="module")
def lin():
  return schedules.linear_beta_schedule(1000)


@pytest.fixture(scope="module")
def cos():
  return schedules.cosine_beta_schedule(1000)
