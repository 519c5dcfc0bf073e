"""Two processes on localhost (2 x 2 CPU devices) agree with a single-process run."""
import os

import jax
import numpy as np
import optax

from tests.multiprocess import ROOT, run_workers

NUM_STEPS = 6


def train_digits(mesh):
  """Trains the digits CNN a few steps with the shared loop; returns host params."""
  from iclr24_jax.common import loop
  from iclr24_jax.common.data import BatchStream, load_digits
  from iclr24_jax.vision import classify
  from iclr24_jax.vision.models import CNN
  ds = load_digits()
  model = CNN(10, features=(8, 16), dense=32)
  tx = optax.adam(1e-2)
  stream = BatchStream({"x": ds.train.x, "y": ds.train.y}, 32, seed=0)
  res = loop.train_loop(init_fn=lambda k: classify.init(k, model, ds.input_shape, tx),
                        train_step=classify.make_train_step(model), batches=stream, num_steps=NUM_STEPS,
                        key=jax.random.key(0), mesh=mesh, log_every=NUM_STEPS, progress=False)
  return jax.device_get(res.state.params)


def test_two_processes_match_single_process(tmp_path):
  run_workers(os.path.join(ROOT, "tests", "common", "_dist_worker.py"), [tmp_path / f"p{i}.npy" for i in range(2)])
  from iclr24_jax.common import sharding
  single = train_digits(sharding.make_mesh(devices=jax.devices()[:4]))
  flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(single)])
  for i in range(2):
    np.testing.assert_allclose(np.load(tmp_path / f"p{i}.npy"), flat, atol=1e-5)
