"""Test setup: 8 simulated CPU devices (before JAX is used), the persistent compilation cache, shared-data lookup,
quiet logs."""
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

from iclr24_jax.common.sharding import simulate_cpu_devices  # noqa: E402

simulate_cpu_devices(8)  # also widens XLA's CPU pools (see its docstring: collective deadlock on 2 cores)

from iclr24_jax.common.compile_cache import enable_compilation_cache  # noqa: E402

enable_compilation_cache()  # a rerun loads its programs from disk; ICLR24_JAX_COMPILATION_CACHE=0 turns it off

import logging  # noqa: E402

import pytest  # noqa: E402

logging.getLogger("absl").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """The public data beside the project (ICLR24_DATA or ../shared/data); skips when truly absent."""
  from iclr24_jax.common.data import shared_data_dir
  d = shared_data_dir()
  if d is None:
    pytest.skip("shared data folder not found: set ICLR24_DATA or place the data at ../shared/data")
  return d
