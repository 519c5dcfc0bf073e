"""FPS's baselines (`papers/fps/baselines.py`): DPS with zero step is DDPM, its guidance reduces the
residual, its step against a numpy re-implementation of the official DPS update."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.diffusion import samplers
from iclr24_jax.papers import fps
from .helpers import SCHED, DEN


@pytest.fixture(scope="module")
def dps_fn():
  op = fps.Dense(np.array([[1.0, 0.5]]))
  return jax.jit(lambda k, z: fps.dps_sample(k, DEN, SCHED, op, jnp.array([1.5]), 256, 20, z)), op


def test_dps_with_zero_step_is_ddpm(dps_fn):
  fn, _ = dps_fn
  x = fn(jax.random.key(0), 0.0)
  ref = samplers.sample(jax.random.key(0), DEN, SCHED, (256, 2), method="ddpm", num_steps=20)
  np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-5)


def test_dps_guidance_reduces_the_residual(dps_fn):
  fn, op = dps_fn
  res = lambda x: float(jnp.mean(jnp.abs(op.forward(x)[:, 0] - 1.5)))  # noqa: E731
  assert res(fn(jax.random.key(0), 0.3)) < 0.5 * res(fn(jax.random.key(0), 0.0))


@pytest.mark.parametrize("clip", [None, 1.0])
def test_dps_step_is_the_official_dps_update(clip):
  """dps_step against a numpy re-implementation of the official DPS step (p_sample_loop + PosteriorSampling,
  clip_denoised): x0 = clamp((x - sqrt(1 - a_t) eps) / sqrt(a_t)); mean = q_posterior_mean(x0, x);
  x' = mean + sqrt(var) z - zeta grad_x ||y - A x0(x)||, for a linear eps(x, t) = W x + b + c t whose Jacobian is W,
  so grad = -J^T A^T r / ||r|| with J = diag(|x0| < 1) (I - sqrt(1 - a_t) W) / sqrt(a_t). Variance beta-tilde (the
  documented deviation from the learned-range variance)."""
  rng = np.random.default_rng(5)
  w = 0.3 * rng.standard_normal((3, 3))
  bias, c = rng.standard_normal(3), 0.01
  a_mat = rng.standard_normal((2, 3))
  op = fps.Dense(a_mat)
  x_t = rng.standard_normal((4, 3)) * 1.5
  y = rng.standard_normal(2)
  t, a_t, a_s, zeta = 40.0, 0.45, 0.62, 0.7
  den = lambda x, tt: x @ jnp.asarray(w.T, jnp.float32) + jnp.asarray(bias, jnp.float32) + c * tt[:, None]  # noqa
  key = jax.random.key(3)
  out, norms = jax.jit(lambda x: fps.dps_step(den, op, jnp.asarray(y, jnp.float32), x, jnp.float32(t), a_t, a_s, key,
                                              zeta, clip_x0=clip))(jnp.asarray(x_t, jnp.float32))
  eps = x_t @ w.T + bias + c * t
  x0_raw = (x_t - np.sqrt(1 - a_t) * eps) / np.sqrt(a_t)
  x0 = x0_raw if clip is None else np.clip(x0_raw, -clip, clip)
  alpha = a_t / a_s
  mean = (np.sqrt(a_s) * (1 - alpha) * x0 + np.sqrt(alpha) * (1 - a_s) * x_t) / (1 - a_t)   # q_posterior_mean
  var = (1 - a_s) / (1 - a_t) * (1 - alpha)
  z = np.asarray(jax.random.normal(key, (4, 3)), np.float64)
  r = y[None] - x0 @ a_mat.T
  norm = np.linalg.norm(r, axis=1)
  jac = (np.eye(3) - np.sqrt(1 - a_t) * w) / np.sqrt(a_t)                  # d x0_raw / d x
  mask = np.ones_like(x0_raw) if clip is None else (np.abs(x0_raw) < clip).astype(float)
  grad = -np.einsum("bi,ij->bj", mask * (r @ a_mat) / norm[:, None], jac)  # J^T A^T r / ||r||, J = diag(mask) jac
  want = mean + np.sqrt(var) * z - zeta * grad
  if clip is not None:
    assert 0 < mask.sum() < mask.size                                     # the clamp is active on some entries
  np.testing.assert_allclose(norms, norm, rtol=1e-5)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
