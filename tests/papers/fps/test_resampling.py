"""FPS's resampling (`papers/fps/resampling.py`): every scheme is unbiased, the ESS by hand."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import fps


@pytest.mark.parametrize("scheme", ["multinomial", "systematic", "stratified"])
def test_resampling_is_unbiased(scheme):
  w = np.array([0.05, 0.4, 0.15, 0.3, 0.1])
  m, reps = 5, 4000
  idx = jax.jit(jax.vmap(lambda k: fps.resample(k, jnp.log(jnp.asarray(w)), scheme)))(
      jax.random.split(jax.random.key(0), reps))
  counts = np.stack([np.bincount(np.asarray(r), minlength=m) for r in idx])    # [reps, M]
  se = counts.std(0, ddof=1) / np.sqrt(reps) + 1e-12
  assert np.all(np.abs(counts.mean(0) - m * w) < 5 * se + 1e-9)
  if scheme == "systematic":   # every particle gets floor(M w) or ceil(M w) copies
    assert np.all((counts >= np.floor(m * w)) & (counts <= np.ceil(m * w)))


def test_ess_values():
  np.testing.assert_allclose(fps.ess(jnp.zeros(8)), 8.0, rtol=1e-5)
  np.testing.assert_allclose(fps.ess(jnp.array([0.0, -jnp.inf, -jnp.inf])), 1.0, rtol=1e-5)
