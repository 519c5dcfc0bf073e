"""FPS's exact references (`papers/fps/exact.py`): the noise-tracking Kalman filter is the exact
posterior, the telescoping limit is exact for fine DDPM and FPS's limit is not."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.diffusion import samplers
from iclr24_jax.papers import fps
from .helpers import SCHED, _prior


@pytest.mark.parametrize("dim", [1, 2])
def test_noise_tracking_kalman_is_the_exact_posterior(dim):
  # All y_t = A x_t + sqrt(abar_t) sigma n share n: carrying n in the state gives p(x_0 | y) exactly, for the
  # bridge's sequences AND for arbitrary ones ending at y (the y_t, t > 0, carry no information about x_0).
  # FPS's HMM with the SAME exact kernel (only the emissions differ) is several times too narrow along A.
  mean0, cov0 = _prior(dim)
  a = np.array([[1.0, 0.5][:dim]])
  op = fps.Dense(a)
  sigma, y = 0.25, np.array([0.9])
  _, a_t, a_s = samplers.sampling_grid(SCHED, 100)
  y_start, ys = jax.vmap(lambda k: fps.measurement_sequence(k, op, jnp.asarray(y, jnp.float32), a_t, a_s, 0.95))(
      jax.random.split(jax.random.key(0), 3))
  rng = np.random.default_rng(1)
  arb = np.concatenate([rng.standard_normal((3, 99, 1)) * 3, np.broadcast_to(y, (3, 1, 1))], 1)
  pm, pc = fps.gaussian_posterior(mean0, cov0, a, y, sigma)
  for y0, seq in ((y_start, ys), (rng.standard_normal((3, 1)), arb)):
    seq = np.asarray(seq, np.float64)
    seq[:, -1] = y
    m, p = fps.noise_tracking_kalman(mean0, cov0, a, sigma, y0, seq, a_t, a_s)
    chex.assert_shape(m, (3, dim))
    np.testing.assert_allclose(m, np.broadcast_to(pm, m.shape), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(p, pc, rtol=1e-7, atol=1e-10)
    ms, p_fps = fps.kalman_reference(mean0, cov0, a, sigma, y0, seq, a_t, a_s, sampler="exact")
    ratio = (a @ p_fps @ a.T)[0, 0] / (a @ pc @ a.T)[0, 0]
    assert ratio < 0.5, ratio     # FPS's emission model alone makes the posterior over-confident
  # Closed form for one (almost) noiseless step, D = k = 1, A = 1, y_start = y = 1: y = x_0 + sigma n with
  # x_0 ~ N(0, s0), n ~ N(0, 1): posterior variance s0 sigma^2 / (s0 + sigma^2), mean s0 y / (s0 + sigma^2).
  if dim == 1:
    m1, p1 = fps.noise_tracking_kalman(np.zeros(1), np.eye(1) * 2.0, np.eye(1), 0.5, np.ones(1), np.ones((1, 1)),
                                       np.array([1.0 - 1e-12]), np.array([1.0]))
    np.testing.assert_allclose(p1[0, 0], 2.0 * 0.25 / 2.25, rtol=1e-6)
    np.testing.assert_allclose(m1[0], 2.0 / 2.25, rtol=1e-6)


def test_telescoping_limit_is_exact_for_fine_ddpm_and_fps_is_not():
  # M -> infinity, 1000 DDPM steps, exact denoiser: the telescoping limit is the exact posterior to < 1% in
  # Var(A x) and to 0.01 posterior std in the mean; FPS's limit (averaged over 20 bridge sequences) is < 0.3x.
  mean0, cov0 = _prior(2)
  a = np.array([[1.0, 0.5]])
  op = fps.Dense(a)
  _, a_t, a_s = samplers.sampling_grid(SCHED, 1000)
  for sigma in (0.25, 1.0):
    y = np.array([0.9])
    pm, pc = fps.gaussian_posterior(mean0, cov0, a, y, sigma)
    tm, tp = fps.telescoping_reference(mean0, cov0, a, sigma, y, a_t, a_s, sampler="ddpm")
    np.testing.assert_allclose((a @ tp @ a.T)[0, 0] / (a @ pc @ a.T)[0, 0], 1.0, atol=0.01)
    assert np.linalg.norm(tm - pm) < 0.01 * np.sqrt(np.trace(pc))
    y0, ys = jax.vmap(lambda k: fps.measurement_sequence(k, op, jnp.asarray(y, jnp.float32), a_t, a_s, 0.95))(
        jax.random.split(jax.random.key(3), 20))
    ms, p = fps.kalman_reference(mean0, cov0, a, sigma, y0, ys, a_t, a_s, sampler="ddpm")
    _, cov = fps.moments_over_sequences(ms, p)
    assert (a @ cov @ a.T)[0, 0] / (a @ pc @ a.T)[0, 0] < 0.3
