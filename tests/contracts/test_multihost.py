"""The eager checks never fetch a global array: two processes (2 x 2 CPU devices) call public functions eagerly
on arrays spanning both, get the single-process answers, a NaN (not a crash) for a bad value they cannot read,
and a named error from a host-side function."""
import os

import numpy as np

from tests.contracts import _multihost_worker as worker
from tests.common.helpers import ROOT, run_workers


def test_eager_checks_on_global_arrays(tmp_path):
  run_workers(os.path.join(ROOT, "tests", "contracts", "_multihost_worker.py"),
              [tmp_path / f"p{i}.npz" for i in range(2)])
  # the single-process answers, from the same (addressable) inputs
  data = worker.inputs()
  data["p_bad"] = data["p"]
  single = worker.compute(data, np.asarray, host_function=False)
  for i in range(2):
    got = np.load(tmp_path / f"p{i}.npz")
    np.testing.assert_allclose(got["propagate"], single["propagate"], rtol=1e-6)
    np.testing.assert_allclose(got["fit"], single["fit"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["unroll"], single["unroll"], rtol=1e-6)
    assert np.isfinite(got["unroll"]).all()          # the masked -inf entry is a hidden entry, not a NaN
    assert np.isnan(got["propagate_bad"]).all()       # p = 1.7 on another host: poisoned, not raised or clamped
    assert int(got["host_function"]) == 1             # cross_validate names the global array (no RuntimeError)
