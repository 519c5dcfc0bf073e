"""GraphCare training (`papers/graphcare/train.py`): task losses by hand, a train step compiled once, 1 vs 8
devices, several seeds in one program."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.common import sharding
from iclr24_jax.papers import graphcare
from .helpers import _bat


def _init(model, batch, tx, node_embedding=None, relation_embedding=None):
  return jax.jit(lambda k: graphcare.init(k, model, batch, tx, node_embedding, relation_embedding))(
      jax.random.key(0))


def test_task_loss_hand_values():
  logits = jnp.array([[0.0], [2.0], [5.0]])
  labels = jnp.array([1, 0, 1])
  mask = jnp.array([True, True, False])
  # BCE: [log 2, log(1 + e^2)] -> (0.693147 + 2.126928) / 2 = 1.410038 (third row masked)
  np.testing.assert_allclose(graphcare.task_loss(logits, labels, mask, "binary"), 1.410038, atol=1e-4)
  # CE over 2 classes with logits [0, 2], label 1 -> log(1 + e^-2) = 0.126928
  np.testing.assert_allclose(graphcare.task_loss(jnp.array([[0.0, 2.0]]), jnp.array([1]), jnp.array([True]),
                                                 "multiclass"), 0.126928, atol=1e-4)


def test_train_step_lowers_loss_compiled_once(small_world):
  _, ckg, _, batcher = small_world
  batch = batcher.batch(np.arange(16))
  model = _bat(ckg)
  state = _init(model, batch, optax.adam(1e-2), ckg.node_embedding, ckg.relation_embedding)
  bound = graphcare.make_train_step(model, "binary")

  def step_fn(state, batch, key):
    return bound(state, batch, key)

  step = jax.jit(chex.assert_max_traces(step_fn, n=1))
  eval_loss = jax.jit(lambda p: graphcare.loss_fn(p, batch, jax.random.key(0), model=model, task="binary",
                                                  train=False)[0])
  loss0 = float(eval_loss(state.params))
  for _ in range(10):
    state, metrics = step(state, batch, jax.random.key(1))
  loss1 = float(eval_loss(state.params))
  assert int(state.step) == 10 and loss1 < 0.8 * loss0


def test_one_and_eight_devices_agree(small_world):
  _, ckg, _, batcher = small_world
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices")
  batch = batcher.batch(np.arange(16))
  model = _bat(ckg)
  state = _init(model, batch, optax.adam(1e-3))
  out = []
  for mesh in sharding.device_meshes((1, 8)):
    with jax.set_mesh(mesh):
      fn = jax.jit(lambda s, b: graphcare.loss_fn(s.params, b, jax.random.key(0), model=model, task="binary")[0],
                   in_shardings=(sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)))
      out.append(float(fn(state, sharding.shard_batch(batch, mesh))))
  np.testing.assert_allclose(out[0], out[1], rtol=1e-5)


def test_fit_seeds_seed_independent_and_chunk_equivalent(small_world):
  from iclr24_jax.papers.graphcare import train as train_lib
  _, ckg, _, batcher = small_world
  model = _bat(ckg)
  idx = np.arange(64)
  sample = batcher.batch(idx[:16])
  tx = optax.adam(1e-2)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  streams = {s: batcher.train_batches(idx, s) for s in (0, 1)}
  kw = dict(mesh=mesh, node_embedding=ckg.node_embedding, relation_embedding=ckg.relation_embedding, log_every=4)
  both = train_lib.fit_seeds(model, "binary", tx, sample, lambda s, t: streams[s](t), 4, (0, 1), steps_per_call=2,
                             **kw)
  one = train_lib.fit_seeds(model, "binary", tx, sample, lambda s, t: streams[s](t), 4, (1,), steps_per_call=1, **kw)
  # seed 1 trained beside seed 0 in 2-step scan chunks == seed 1 alone, step by step
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a[1], b[0], rtol=1e-5, atol=1e-6), both["params"],
               one["params"])
  leaves = jax.tree.leaves(both["params"])
  assert any(np.abs(l[0] - l[1]).max() > 1e-6 for l in leaves)     # different seeds, different params
