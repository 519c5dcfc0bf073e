"""Mesh and sharding: the same step on 1 and 8 devices, and on two processes of 2 devices each, gives the same
params; clear errors."""
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.common import loop, sharding
from iclr24_jax.common.data import BatchStream, load_digits
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.vision import classify
from iclr24_jax.vision.models import CNN
from tests.common.helpers import run_workers

from .helpers import train_digits


def test_eight_devices_exist():
  assert jax.device_count() == 8


def test_make_mesh_shapes_and_errors():
  assert dict(sharding.make_mesh().shape) == {"data": 8, "model": 1}
  assert dict(sharding.make_mesh({"data": -1, "model": 2}).shape) == {"data": 4, "model": 2}
  assert dict(sharding.make_mesh(devices=jax.devices()[:1]).shape) == {"data": 1, "model": 1}
  with pytest.raises(ValueError, match="product is 8"):
    sharding.make_mesh({"data": 3, "model": 1})
  with pytest.raises(ValueError, match="unknown axes"):
    sharding.make_mesh({"data": -1, "pipeline": 1})


def test_shard_batch_places_rows_and_checks_divisibility():
  mesh = sharding.make_mesh()
  x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
  xs = sharding.shard_batch({"x": x}, mesh)["x"]
  np.testing.assert_array_equal(np.asarray(xs), x)
  assert len(xs.addressable_shards) == 8
  assert xs.addressable_shards[1].data.shape == (2, 3)
  with pytest.raises(ValueError, match="not divisible by the mesh's data axis"):
    sharding.shard_batch({"x": x[:12]}, mesh)


def _run_steps(mesh, num_steps=5):
  ds = load_digits()
  model = CNN(10, features=(8, 16), dense=32)
  tx = optax.adam(1e-2)
  stream = BatchStream({"x": ds.train.x, "y": ds.train.y}, 32, seed=0)
  step = loop.compile_step(classify.make_train_step(model), mesh)
  state = jax.jit(lambda k: classify.init(k, model, ds.input_shape, tx),
                  out_shardings=sharding.replicated_sharding(mesh))(jax.random.key(0))
  key = jax.random.key(1)
  for s in range(num_steps):
    state, _ = step(state, sharding.shard_batch(stream(s), mesh), key)
  return jax.device_get(state.params)


def test_one_and_eight_devices_agree():
  p1, p8 = (_run_steps(mesh) for mesh in sharding.device_meshes((1, 8)))
  chex.assert_trees_all_close(p1, p8, atol=1e-5)


def test_device_meshes_are_the_first_n_devices_and_check_counts():
  meshes = list(sharding.device_meshes())
  assert [m.devices.size for m in meshes] == [1, 8]           # default: 1 and every device (8 simulated)
  assert list(meshes[0].devices.flat) == jax.devices()[:1] and dict(meshes[1].shape) == {"data": 8, "model": 1}
  with pytest.raises(ValueError, match="9 devices"):
    list(sharding.device_meshes((1, 9)))


def test_train_step_compiles_once_and_lowers_loss():
  ds = load_digits()
  model = CNN(10, features=(8, 16), dense=32)
  tx = optax.adam(3e-3)
  batch = {"x": jnp.asarray(ds.train.x[:64]), "y": jnp.asarray(ds.train.y[:64])}
  state = classify.init(jax.random.key(0), model, ds.input_shape, tx)
  step = jax.jit(chex.assert_max_traces(classify.make_train_step(model), n=1))
  losses = []
  for _ in range(20):
    state, m = step(state, batch, jax.random.key(1))
    losses.append(float(m["loss"]))
  assert losses[-1] < losses[0]
  assert int(state.step) == 20


def test_train_state_needs_tx():
  state = TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.ones(2)}, opt_state=None)
  with pytest.raises(ValueError, match="TrainState.create"):
    state.apply_gradients({"w": jnp.ones(2)})


def test_simulated_devices_get_a_wider_cpu_thread_pool():
  # conftest called simulate_cpu_devices(8): XLA's CPU pool must have more threads than devices, or an
  # 8-device all-reduce can deadlock (see sharding.simulate_cpu_devices).
  import os
  from iclr24_jax.common.sharding import simulate_cpu_devices
  assert int(os.environ["NPROC"]) > jax.device_count()
  jax.numpy.ones(2).block_until_ready()
  tasks = "/proc/self/task"
  if os.path.isdir(tasks):
    names = []
    for t in os.listdir(tasks):
      try:
        with open(os.path.join(tasks, t, "comm")) as f:
          names.append(f.read().strip())
      except OSError:
        pass
    assert sum(n.endswith("XLAEigen") for n in names) >= int(os.environ["NPROC"]) > jax.device_count()
  with pytest.raises(ValueError, match="n >= 1"):
    simulate_cpu_devices(0)


def test_constrain_batch_pins_rows_to_data_axis_only_under_a_dividing_mesh():
  x = jnp.arange(8 * 3, dtype=jnp.float32).reshape(8, 3)
  # No mesh set: the identity, and no constraint in the traced program.
  assert sharding.constrain_batch(x) is x
  assert "sharding_constraint" not in str(jax.make_jaxpr(sharding.constrain_batch)(x))
  mesh = sharding.make_mesh({"data": 4, "model": 2})
  with jax.set_mesh(mesh):
    jaxpr = str(jax.make_jaxpr(sharding.constrain_batch)(x))
    assert "sharding_constraint" in jaxpr
    # 8 rows over a data axis of 4: each data shard holds rows [2i, 2i+1], whole over 'model'.
    y = jax.jit(lambda a: sharding.constrain_batch(a * 1.0))(x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    assert y.sharding.spec == jax.sharding.PartitionSpec("data")
    assert {s.data.shape for s in y.addressable_shards} == {(2, 3)}
    # 6 rows do not divide over 4 data shards: left unconstrained rather than failing.
    x6 = x[:6]
    assert "sharding_constraint" not in str(jax.make_jaxpr(sharding.constrain_batch)(x6))


def test_two_processes_match_single_process(tmp_path):
  # `initialize_distributed` on localhost: 2 processes x 2 CPU devices train as one 4-device mesh.
  run_workers(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dist_worker.py"),
              [tmp_path / f"p{i}.npy" for i in range(2)])
  single = train_digits(sharding.make_mesh(devices=jax.devices()[:4]))
  flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(single)])
  for i in range(2):
    np.testing.assert_allclose(np.load(tmp_path / f"p{i}.npy"), flat, atol=1e-5)
