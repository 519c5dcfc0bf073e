"""Shared by the multi-process tests (test_sharding, test_loop, tests/contracts/test_multihost) and their worker
scripts: the same few training steps run in one process or split over two, and the launcher that starts JAX's
distributed runtime on localhost in several worker processes (each worker takes `<coordinator port> <process id>
<output path>` and writes its answer to the path)."""
import os
import socket
import subprocess
import sys

import jax
import optax

NUM_STEPS = 6
# The repository root (tests/common/helpers.py is two folders below it).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def free_port() -> int:
  """A TCP port on 127.0.0.1 that no one listens on now (the coordinator's)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_workers(worker: str, outputs: list, timeout: float = 240) -> None:
  """Runs `python worker <port> <i> <outputs[i]>` for every i at once and waits for all of them.

  Args:
    worker: path of the worker script.
    outputs: one output path per process (their count is the process count).
    timeout: seconds each process may take; on a timeout every process is killed and the error raised.

  Raises:
    AssertionError: a process exited non-zero (the message holds the end of its stderr).
  """
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)   # each worker sets its own device count
  port = free_port()
  procs = [subprocess.Popen([sys.executable, worker, str(port), str(i), str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i, out in enumerate(outputs)]
  for p in procs:
    try:
      _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    assert p.returncode == 0, err[-3000:]
