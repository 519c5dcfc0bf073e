"""Fixtures shared by the Co-Boosting test modules."""
import jax
import jax.numpy as jnp
import pytest

from iclr24_jax.papers import coboosting
from iclr24_jax.papers.coboosting import model as model_lib
from iclr24_jax.vision.models import MLP
from .helpers import K, S


@pytest.fixture(scope="session")
def mlp_method():
  """3 MLP clients (stacked), an MLP server and a tiny generator on 8x8 images."""
  c = 3
  m = MLP(K, hidden=(16,))
  params = model_lib.stack_params([m.init(jax.random.key(i), jnp.zeros((1, S, S, 1)))["params"] for i in range(c)])
  clients = model_lib.ClientSet((m,), c, stacked=True, vmap=True)
  method = coboosting.Method(clients=clients, server=MLP(K, hidden=(16,)),
                             generator=model_lib.Generator(S, 1, ngf=4), num_classes=K, nz=8)
  return method, params
