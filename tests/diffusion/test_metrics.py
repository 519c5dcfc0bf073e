"""Sample metrics (`diffusion/metrics.py`): the sliced Wasserstein distance of a shift by hand."""
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.diffusion import metrics


def test_sliced_wasserstein_of_a_shift():
  # Shifting every point by c moves each 1-D projection by theta . c, so SW_2^2 = E (theta . c)^2 = |c|^2 / D.
  x = np.random.default_rng(0).standard_normal((512, 2)).astype(np.float32)
  c = jnp.array([0.3, -0.4])  # |c|^2 = 0.25, D = 2 -> SW_2 = sqrt(0.125) = 0.35355 (up to the P projections)
  sw = metrics.sliced_wasserstein(x + c, x, jax.random.key(1), num_projections=4096)
  np.testing.assert_allclose(sw, np.sqrt(0.125), rtol=3e-2)
  assert float(metrics.sliced_wasserstein(x, x, jax.random.key(1))) == 0.0
