"""FPS's exactness study (`papers/fps/study_exactness.py`): the DPS step size is chosen on
validation runs only."""
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.papers.fps import study_exactness


def test_exactness_dps_step_size_is_chosen_on_validation_runs_only():
  """`tune_dps` picks zeta on the validation runs and reports the test runs at that zeta, even where the test runs
  would favour another zeta (the old oracle choice would have picked 1.0 here)."""
  g = gmm_lib.GaussianMixture(jnp.array([0.25, 0.75]), jnp.array([[0.0, 0.0], [4.0, 0.0]]),
                              jnp.stack([jnp.eye(2) * 0.1] * 2))
  post = study_exactness.PosteriorSummary(g)
  rng = np.random.default_rng(0)
  ref_val, ref_test = rng.standard_normal((8, 2)), rng.standard_normal((8, 2)) + [4.0, 0.0]
  shift = np.array([2.0, 0.0])
  # validation: zeta 0.1 reproduces its exact draw (SW 0), zeta 1.0 is shifted; test: the other way round
  x_val = {0.1: ref_val, 1.0: ref_val + shift}
  x_test = {0.1: ref_test + shift, 1.0: ref_test}
  out = study_exactness.tune_dps(post, x_val, x_test, [ref_val], [ref_test], np.eye(2), floor_sw=0.5,
                                 seed_floor=0.5, num_seeds=2)
  assert out["zeta"] == 0.1
  np.testing.assert_allclose(out["val_sw_by_zeta"][0.1], 0.0, atol=1e-6)
  assert out["val_sw_by_zeta"][1.0] > 0.5
  # the rows see the chosen zeta's test runs, scored against the test draws (an independent call gives the same)
  want = study_exactness.posterior_metrics(post, ref_test + shift, [ref_test], np.eye(2))
  np.testing.assert_allclose(out["test"]["sw"], want["sw"], rtol=1e-6)
  np.testing.assert_allclose(out["test"]["sw_ratio"], want["sw"] / 0.5, rtol=1e-6)
  np.testing.assert_allclose(out["test_sw_ratio_by_zeta"][1.0], 0.0, atol=1e-5)   # visible, never chosen on
  assert all(len(v) == 2 for v in out["test_seeds"].values())
  with pytest.raises(ValueError, match="same non-empty zeta grid"):
    study_exactness.tune_dps(post, x_val, {0.1: ref_test}, [ref_val], [ref_test], np.eye(2), 0.5, 0.5, 2)
