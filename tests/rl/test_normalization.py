"""Running observation statistics (`rl/normalization.py`) against numpy."""
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.rl import normalization


def test_running_stats_match_numpy_and_are_split_invariant():
  x = np.random.default_rng(0).normal(3.0, 2.0, size=(64, 5)).astype(np.float32)
  s_all = normalization.update(normalization.init((5,)), jnp.asarray(x))
  s_parts = normalization.init((5,))
  for part in np.split(x, [10, 37]):
    s_parts = normalization.update(s_parts, jnp.asarray(part))
  np.testing.assert_allclose(s_all.mean, x.mean(0), rtol=1e-5)
  np.testing.assert_allclose(s_all.var, x.var(0), rtol=1e-5)
  np.testing.assert_allclose(s_parts.mean, s_all.mean, rtol=1e-5)
  np.testing.assert_allclose(s_parts.var, s_all.var, rtol=1e-5)
  z = normalization.normalize(s_all, jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(z).mean(0), 0.0, atol=1e-5)
  with pytest.raises(ValueError, match="trailing shape"):
    normalization.update(s_all, jnp.zeros((3, 4)))
