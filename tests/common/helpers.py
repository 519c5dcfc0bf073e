"""Shared by test_sharding and its multi-process worker (`_dist_worker.py`): the same few training steps, run in
one process or split over two."""
import jax
import optax

NUM_STEPS = 6


def train_digits(mesh):
  """Trains the digits CNN a few steps with the shared loop.

  Args:
    mesh: the device mesh the loop shards its batches over (one process's or every process's devices).

  Returns:
    The parameters after NUM_STEPS steps, on the host.
  """
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
