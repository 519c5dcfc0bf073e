"""Co-Boosting models (`papers/coboosting/model.py`): the generator, stacked and heterogeneous client sets, FedAvg."""
import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import coboosting
from iclr24_jax.papers.coboosting import model as model_lib
from iclr24_jax.vision.models import MLP
from .helpers import K, S


def test_generator_shapes_and_range(mlp_method):
  method, _ = mlp_method

  @jax.jit
  def init_and_generate(k, z):
    v = model_lib.init_generator(k, method.generator, 8)
    return v, model_lib.generate(method.generator, v, z)

  v, x = init_and_generate(jax.random.key(0), jax.random.normal(jax.random.key(1), (6, 8)))
  chex.assert_shape(x, (6, S, S, 1))
  assert x.dtype == jnp.float32 and float(x.min()) > 0.0 and float(x.max()) < 1.0
  # Official reset_model: conv/linear weights N(0, 0.02), biases 0.
  w = np.asarray(v["params"]["Dense_0"]["kernel"])
  assert abs(w.std() - 0.02) < 0.005 and np.all(np.asarray(v["params"]["Dense_0"]["bias"]) == 0)
  with pytest.raises(ValueError, match="multiple of 4"):
    jax.eval_shape(lambda: model_lib.Generator(6, 1, 4).init(jax.random.key(0), jnp.zeros((2, 8))))


def test_vmap_and_unrolled_clients_agree(mlp_method):
  method, params = mlp_method
  x = jax.random.uniform(jax.random.key(0), (5, S, S, 1))
  a = method.clients.logits(params, x)
  b = dataclasses.replace(method.clients, vmap=False).logits(params, x)
  chex.assert_shape(a, (3, 5, K))
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_heterogeneous_clients_are_a_list_of_models():
  models = (MLP(K, hidden=(8,)), MLP(K, hidden=(16, 8)))
  params = tuple(m.init(jax.random.key(i), jnp.zeros((1, S, S, 1)))["params"] for i, m in enumerate(models))
  clients = model_lib.ClientSet(models, 2, stacked=False)
  x = jax.random.uniform(jax.random.key(0), (5, S, S, 1))
  out = jax.jit(clients.logits)(params, x)
  chex.assert_shape(out, (2, 5, K))
  np.testing.assert_allclose(out[1], models[1].apply({"params": params[1]}, x), rtol=1e-5, atol=1e-6)
  method = coboosting.Method(clients=clients, server=models[0], generator=model_lib.Generator(S, 1, 4),
                             num_classes=K, nz=8)
  teacher, m = coboosting.weight_step(method, {"clients": params, "weights": jnp.asarray([0.5, 0.5])},
                                      {"x": x, "y": jnp.arange(5) % K}, 0.1)
  assert teacher["weights"].shape == (2,) and np.isfinite(float(m["ensemble_ce"]))
  with pytest.raises(ValueError, match="exactly one model"):
    model_lib.ClientSet(models, 2, stacked=True)


def test_fedavg_mean_of_stacked_params(mlp_method):
  _, params = mlp_method
  avg = coboosting.fedavg_params(params)
  leaf = jax.tree.leaves(params)[0]
  np.testing.assert_allclose(jax.tree.leaves(avg)[0], leaf.mean(0), rtol=1e-6)
  weighted = coboosting.fedavg_params(params, sizes=[1, 0, 0])
  np.testing.assert_allclose(jax.tree.leaves(weighted)[0], leaf[0], rtol=1e-6)
