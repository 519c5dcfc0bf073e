"""Worker for test_sharding's two-process test: one of two processes (2 CPU devices each) training the digits CNN."""
import sys


def main():
  port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
  import pathlib
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from iclr24_jax.common import sharding
  sharding.initialize_distributed(f"127.0.0.1:{port}", num_processes=2, process_id=pid, cpu_devices_per_process=2)
  import jax
  import numpy as np
  from tests.common.helpers import train_digits
  assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
  params = train_digits(sharding.make_mesh())
  flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(params)])
  np.save(out, flat)


if __name__ == "__main__":
  main()
