"""FPS's study (`papers/fps/study.py`): the range verdict by hand, with the exactness study's posterior
metrics on the library's mixture."""
import jax.numpy as jnp
import numpy as np

from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.papers.fps import study_exactness


def test_range_verdict_and_library_metrics():
  # mean +- 2 se of [0.9, 1.0, 1.1] = 1.0 +- 0.115: inside [0.8, 1.25] -> yes; [0.2, 0.21, 0.22] -> no;
  # [0.7, 0.8, 0.9] = 0.8 +- 0.115 straddles 0.8 -> inconclusive; one value has no se.
  from iclr24_jax.papers.fps import study
  assert study.range_verdict([0.9, 1.0, 1.1]) == "yes"
  assert study.range_verdict([0.2, 0.21, 0.22]) == "no"
  assert study.range_verdict([0.7, 0.8, 0.9]) == "inconclusive"
  assert study.range_verdict([1.3]) == "no"
  # posterior_metrics on the library's mixture: 3 points at the means of a 2-component mixture with weights
  # (0.25, 0.75): fractions (1/3, 2/3) -> TV = |1/3 - 1/4| = 1/12.
  g = gmm_lib.GaussianMixture(jnp.array([0.25, 0.75]), jnp.array([[0.0, 0.0], [4.0, 0.0]]),
                              jnp.stack([jnp.eye(2) * 0.1] * 2))
  post = study_exactness.PosteriorSummary(g)
  x = np.array([[0.0, 0.0], [4.0, 0.0], [4.0, 0.1]])
  met = study_exactness.posterior_metrics(post, x, [x], np.eye(2))
  np.testing.assert_allclose(met["weight_tv"], 1 / 12, rtol=1e-6)
  np.testing.assert_allclose(met["sw"], 0.0, atol=1e-6)    # identical clouds
  np.testing.assert_allclose(post.mean, [3.0, 0.0], rtol=1e-6)
