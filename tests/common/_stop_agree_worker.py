"""Worker for test_loop's multi-host stop test: one of two processes (JAX's distributed runtime on localhost, its
preemption service on) running the boundaries of a staged driver (two `Stages` loops whose steps each count from
0 in chunks of 5). Process 1 sends itself SIGTERM at a boundary of the first stage; every process writes where
its loop stopped (stage, step, signal) as JSON."""
import json
import os
import pathlib
import signal
import sys
import time


def main():
  port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from iclr24_jax.common import sharding
  sharding.initialize_distributed(f"127.0.0.1:{port}", num_processes=2, process_id=pid, cpu_devices_per_process=1)
  import jax
  from iclr24_jax.common import loop
  assert jax.process_count() == 2 and loop._preemption_sync_manager() is not None
  stages = loop.Stages(None)   # no workdir: the loops log in memory and stop on signals (no orbax saves)
  chunk, steps = 5, 100
  result = {"stopped": None, "signalled_at": None}
  try:
    for name in ("first", "second"):
      with loop.stage_loop(stages, name, steps) as lp:
        _, run = lp.start(lambda: 0)
        while run.step < steps:
          time.sleep(0.05)   # a chunk's work: the notice reaches every process while the loops run
          step = run.step + chunk
          if pid == 1 and name == "first" and step == 20:
            os.kill(os.getpid(), signal.SIGTERM)   # JAX's notifier takes it: no Python handler is installed
            result["signalled_at"] = [name, step]
          lp.boundary(step, 0, {"x": float(step)})
        lp.finish(0)
  except loop.Preempted as e:
    result["stopped"] = [name, e.step, e.signal_name]
  with open(out, "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  main()
