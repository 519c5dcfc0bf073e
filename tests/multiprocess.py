"""Shared by the multi-process tests: launch JAX's distributed runtime on localhost in several worker processes.

Each worker script takes `<coordinator port> <process id> <output path>` and writes its answer to the path.
"""
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
