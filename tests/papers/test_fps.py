"""Tests for FPS (filtering posterior sampling): operators and their SVDs, the closed-form conditioning, the
measurement sequence, resampling, the particle filter against an exact Kalman filter, DPS, configs and a smoke run.
"""
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.configs import fps as fps_config
from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import samplers, schedules
from iclr24_jax.papers import fps
from iclr24_jax.papers.fps import experiment, programs, study_exactness, study_images

SCHED = schedules.linear_beta_schedule()


def _ops():
  """Small instances of every operator (dense checks are O(n^2))."""
  rng = np.random.default_rng(0)
  mask = (rng.uniform(size=(6, 6, 1)) > 0.4).astype(np.float32)
  return {
      "inpainting": fps.Inpainting(mask),
      "super_resolution": fps.SuperResolution(2, (4, 6, 2)),
      "super_resolution_2d": fps.SuperResolution(3, (6, 6)),
      "gaussian_blur": fps.GaussianBlur(3, 1.0, (6, 6, 1)),
      "motion_blur": fps.MotionBlur(5, (7, 6), angle=30.0),
      "dense_wide": fps.Dense(rng.standard_normal((3, 5))),
      "dense_tall": fps.Dense(rng.standard_normal((6, 4))),
  }


OPS = _ops()


def _basis_matrix(fn, shape):
  """Columns fn(e_j) for the standard basis of `shape` -> [out, n]."""
  n = int(np.prod(shape))
  eye = np.eye(n, dtype=np.float32).reshape((n,) + tuple(shape))
  return np.asarray(fn(jnp.asarray(eye))).reshape(n, -1).T


# ------------------------------------------------------------------------------------------ operators


@pytest.mark.parametrize("name", list(OPS))
def test_adjoint_identity(name):
  op = OPS[name]
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((3,) + op.x_shape), jnp.float32)
  y = jnp.asarray(rng.standard_normal((3,) + op.y_shape), jnp.float32)
  lhs = jnp.sum(op.forward(x) * y, axis=tuple(range(1, 1 + len(op.y_shape))))
  rhs = jnp.sum(x * op.adjoint(y), axis=tuple(range(1, 1 + len(op.x_shape))))
  np.testing.assert_allclose(lhs, rhs, rtol=1e-5, atol=1e-5)
  chex.assert_shape(op.forward(x), (3,) + op.y_shape)
  chex.assert_shape(op.adjoint(y), (3,) + op.x_shape)


@pytest.mark.parametrize("name", list(OPS))
def test_svd_reconstructs_operator(name):
  op = OPS[name]
  n = op.x_size
  a = _basis_matrix(op.forward, op.x_shape)                 # [prod(y_shape), n]
  vt = _basis_matrix(op.vt, op.x_shape)                     # [n, n] (complex for blurs)
  np.testing.assert_allclose(vt @ vt.conj().T, np.eye(n), atol=1e-5)       # V is unitary
  ys_shape = op.y_shape
  ut = _basis_matrix(op.ut, ys_shape)                       # [m, prod(y_shape)]
  np.testing.assert_allclose(ut @ ut.conj().T, np.eye(op.y_size), atol=1e-5)   # U^H has orthonormal rows
  s = np.asarray(op.singular_values)
  assert s.shape == (op.rank,) and np.all(s >= 0)
  # A = U S V^H on the measurement space: U^H A = S_pad V^H
  s_mat = np.zeros((op.y_size, n))
  s_mat[np.arange(op.rank), np.arange(op.rank)] = s
  np.testing.assert_allclose(ut @ a, s_mat @ vt, atol=1e-5)
  # and the SVD path reproduces forward on random inputs
  x = jnp.asarray(np.random.default_rng(2).standard_normal((2,) + op.x_shape), jnp.float32)
  np.testing.assert_allclose(op.forward_svd(x), op.forward(x), atol=1e-5)
  np.testing.assert_allclose(op.v(op.vt(x)), x, atol=1e-5)


def test_inpainting_and_sr_values():
  # Inpainting keeps observed pixels; SR averages blocks: [[1, 2], [3, 4]] -> 2.5.
  op = fps.Inpainting(np.array([[1.0, 0.0], [0.0, 1.0]]))
  np.testing.assert_array_equal(op.forward(jnp.array([[1.0, 2.0], [3.0, 4.0]])), [[1.0, 0.0], [0.0, 4.0]])
  sr = fps.SuperResolution(2, (2, 2))
  np.testing.assert_allclose(sr.forward(jnp.array([[1.0, 2.0], [3.0, 4.0]])), [[2.5]], rtol=1e-6)
  np.testing.assert_allclose(sr.singular_values, [0.5], rtol=1e-6)   # row ones/4 has norm 1/2
  k = fps.gaussian_kernel(5, 1.0)
  np.testing.assert_allclose(k.sum(), 1.0, rtol=1e-12)
  mk = fps.motion_kernel(7, angle=0.0, length=5)
  np.testing.assert_allclose(mk.sum(), 1.0, rtol=1e-12)
  assert np.count_nonzero(mk.sum(1)) == 1 and np.count_nonzero(mk.sum(0)) == 5   # a horizontal streak of 5 px


def test_operators_are_pytrees_for_jit():
  op = OPS["gaussian_blur"]
  x = jnp.ones((1,) + op.x_shape)
  f = jax.jit(lambda o, x: o.forward(x))
  np.testing.assert_allclose(f(op, x), op.forward(x), rtol=1e-6)
  leaves, tree = jax.tree_util.tree_flatten(op)
  assert jax.tree_util.tree_unflatten(tree, leaves).x_shape == op.x_shape


# ------------------------------------------------------------------------------- closed-form conditioning


def _dense_measurement_rows(op):
  """The dense A restricted to the measurement space (inpainting: observed pixels only)."""
  a = _basis_matrix(op.forward, op.x_shape)
  if isinstance(op, fps.Inpainting):
    a = a[np.asarray(op.mask).reshape(-1) > 0]
  return a


@pytest.mark.parametrize("name", list(OPS))
def test_gaussian_condition_matches_dense(name):
  op = OPS[name]
  rng = np.random.default_rng(3)
  n = op.x_size
  mean = rng.standard_normal((2,) + op.x_shape).astype(np.float32)
  y = rng.standard_normal(op.y_shape).astype(np.float32)
  if isinstance(op, fps.Inpainting):
    y = y * np.asarray(op.mask)
  var, lik_var = 0.7, 0.2
  post_mean, sample, log_lik = fps.gaussian_condition(op, jnp.asarray(mean), var, jnp.asarray(y), lik_var,
                                                      z=jnp.zeros((2,) + op.x_shape))
  a = _dense_measurement_rows(op).astype(np.float64)
  yv = y.reshape(-1)[np.asarray(op.mask).reshape(-1) > 0] if isinstance(op, fps.Inpainting) else y.reshape(-1)
  prec = np.eye(n) / var + a.T @ a / lik_var
  cov = np.linalg.inv(prec)
  for b in range(2):
    mu = mean[b].reshape(-1).astype(np.float64)
    ref_mean = cov @ (mu / var + a.T @ yv / lik_var)
    np.testing.assert_allclose(np.asarray(post_mean[b]).reshape(-1), ref_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(sample[b]).reshape(-1), ref_mean, rtol=1e-4, atol=1e-5)   # z = 0
    s = var * a @ a.T + lik_var * np.eye(a.shape[0])
    r = yv - a @ mu
    ref_ll = -0.5 * r @ np.linalg.solve(s, r) - 0.5 * np.linalg.slogdet(2 * np.pi * s)[1]
    np.testing.assert_allclose(float(log_lik[b]), ref_ll, rtol=1e-4, atol=1e-4)
  # The noise map z -> sample - mean is linear with covariance = the posterior covariance.
  noise_map = _basis_matrix(
      lambda z: fps.gaussian_condition(op, jnp.zeros_like(z), var, jnp.zeros(op.y_shape), lik_var, z=z)[1],
      op.x_shape)
  np.testing.assert_allclose(noise_map @ noise_map.T, cov, atol=1e-5)


def test_weight_equals_marginal_likelihood():
  # Eq. (12): p(y|x') p(x'|x_t) / q(x'|x_t, y) does not depend on x' and equals N(y; A mu, v A A^T + a I).
  op = OPS["dense_wide"]
  rng = np.random.default_rng(4)
  a = np.asarray(op.a, np.float64)
  mu = rng.standard_normal(5)
  y = rng.standard_normal(3)
  var, lik_var = 0.3, 0.05
  post_mean, _, log_lik = fps.gaussian_condition(op, jnp.asarray(mu[None], jnp.float32), var,
                                                 jnp.asarray(y, jnp.float32), lik_var)
  cov_q = np.linalg.inv(np.eye(5) / var + a.T @ a / lik_var)

  def log_n(x, m, c):
    d = x - m
    return -0.5 * d @ np.linalg.solve(c, d) - 0.5 * np.linalg.slogdet(2 * np.pi * c)[1]

  for _ in range(3):
    xp = rng.standard_normal(5)
    ratio = (log_n(y, a @ xp, lik_var * np.eye(3)) + log_n(xp, mu, var * np.eye(5))
             - log_n(xp, np.asarray(post_mean[0], np.float64), cov_q))
    np.testing.assert_allclose(ratio, float(log_lik[0]), rtol=1e-4, atol=1e-4)


def test_kernel_rates_reproduce_core_kernels():
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.standard_normal((4, 3)), jnp.float32)
  eps = jnp.asarray(rng.standard_normal((4, 3)), jnp.float32)
  a_t, a_s = jnp.float32(0.3), jnp.float32(0.45)
  ref = samplers.ddpm_transition(x, eps, a_t, a_s)
  rate = fps.kernel_rates("ddpm", 0.95, jnp.array([a_t]), jnp.array([a_s]))[0]
  got = fps.crate_ddim_transition(x, eps, a_t, a_s, rate)
  np.testing.assert_allclose(got.mean, ref.mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got.var, ref.var, rtol=1e-5)
  ddim0 = samplers.ddim_transition(x, eps, a_t, a_s, eta=0.0)
  got0 = fps.crate_ddim_transition(x, eps, a_t, a_s, 0.0)
  np.testing.assert_allclose(got0.mean, ddim0.mean, rtol=1e-5, atol=1e-6)
  # c = 1: x0_hat re-noised to level a_s (mean sqrt(a_s) x0_hat, var 1 - a_s).
  got1 = fps.crate_ddim_transition(x, eps, a_t, a_s, 1.0)
  np.testing.assert_allclose(got1.mean, jnp.sqrt(a_s) * got1.x0, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got1.var, 1 - a_s, rtol=1e-6)


# ---------------------------------------------------------------------------------- measurement sequence


def test_measurement_sequence_marginals():
  op = fps.Dense(np.array([[1.0, 0.5], [0.0, 2.0]]))
  a = np.asarray(op.a, np.float64)
  y = jnp.array([0.7, -1.2])
  _, a_t, a_s = samplers.sampling_grid(SCHED, 20)
  seq = jax.jit(jax.vmap(lambda k: fps.measurement_sequence(k, op, y, a_t, a_s, 0.95)))
  y_start, ys = seq(jax.random.split(jax.random.key(0), 4000))
  np.testing.assert_array_equal(ys[:, -1], jnp.broadcast_to(y, (4000, 2)))   # ends exactly at y
  i = 10   # a middle level: y_s ~ N(sqrt(abar) y, (1 - abar) A A^T)
  ab = float(a_s[i])
  emp_mean, emp_cov = np.mean(np.asarray(ys[:, i]), 0), np.cov(np.asarray(ys[:, i]).T)
  ref_cov = (1 - ab) * a @ a.T
  se = np.sqrt(np.diag(ref_cov) / 4000)
  assert np.all(np.abs(emp_mean - np.sqrt(ab) * np.asarray(y)) < 5 * se)
  se_cov = np.sqrt((np.outer(np.diag(ref_cov), np.diag(ref_cov)) + ref_cov ** 2) / 4000)
  assert np.all(np.abs(emp_cov - ref_cov) < 5 * se_cov)
  # c = 0: one deterministic trajectory given y_T (the normalised noise stays constant).
  y0, ys0 = fps.measurement_sequence(jax.random.key(1), op, y, a_t, a_s, 0.0)
  eps = (np.asarray(ys0[:-1]) - np.sqrt(np.asarray(a_s[:-1]))[:, None] * np.asarray(y)) / np.sqrt(
      1 - np.asarray(a_s[:-1]))[:, None]
  np.testing.assert_allclose(eps, np.broadcast_to(eps[0], eps.shape), atol=2e-4)


# ----------------------------------------------------------------------------------------- resampling


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


# ------------------------------------------------------------------------- the filter vs exact references


D = 2
_RNG = np.random.default_rng(0)
MEAN0 = np.array([0.5, -0.3])
_L = _RNG.standard_normal((D, D))
COV0 = _L @ _L.T + 0.5 * np.eye(D)
GAUSS = gmm_lib.GaussianMixture(jnp.ones(1), jnp.asarray(MEAN0[None], jnp.float32),
                                jnp.asarray(COV0[None], jnp.float32))
DEN = gmm_lib.gmm_denoiser(GAUSS, SCHED)
N_STEPS = 30


@pytest.fixture(scope="module")
def filter_fn():
  """One compiled filter f(keys [R], op, y_start, ys, sigma) -> (particles [R, M, 2], ess [R, N])."""
  times, a_t, a_s = samplers.sampling_grid(SCHED, N_STEPS)

  def run(keys, op, y_start, ys, sigma):
    def one(k):
      x, info = fps.particle_filter(k, DEN, op, y_start, ys, times, a_t, a_s, sigma, 2048,
                                    resampling="systematic")
      return x, info["ess"]
    return jax.vmap(one)(keys)

  return jax.jit(run), (a_t, a_s)


def test_zero_operator_returns_the_unconditional_chain(filter_fn):
  # A = 0: every weight is equal (ESS = M), systematic resampling keeps each particle once, so the particles are
  # i.i.d. draws of the unconditional DDPM chain, whose exact output law is the A = 0 Kalman recursion.
  fn, (a_t, a_s) = filter_fn
  op = fps.Dense(np.zeros((1, 2)))
  y = jnp.zeros((1,))
  y_start, ys = fps.measurement_sequence(jax.random.key(3), op, y, a_t, a_s, 0.95)
  x, ess = fn(jax.random.split(jax.random.key(4), 1), op, y_start, ys, 0.3)
  np.testing.assert_allclose(ess, 2048.0, rtol=1e-4)
  m_ref, p_ref = fps.kalman_reference(MEAN0, COV0, np.zeros((1, 2)), 0.3, y_start, ys, a_t, a_s, sampler="ddpm")
  xs = np.asarray(x[0], np.float64)
  se_mean = np.sqrt(np.diag(p_ref) / len(xs))
  assert np.all(np.abs(xs.mean(0) - m_ref) < 5 * se_mean)
  se_cov = np.sqrt((np.outer(np.diag(p_ref), np.diag(p_ref)) + p_ref ** 2) / len(xs))
  assert np.all(np.abs(np.cov(xs.T) - p_ref) < 5 * se_cov)


def test_gaussian_prior_matches_kalman_filter(filter_fn):
  # With a Gaussian prior the denoiser is affine and FPS's hidden Markov model is linear-Gaussian: the particle
  # cloud must match the Kalman filter of the same measurement sequence within Monte Carlo error (16 runs).
  fn, (a_t, a_s) = filter_fn
  a = np.array([[1.0, 0.5]])
  op = fps.Dense(a)
  sigma = 0.3
  y_start, ys = fps.measurement_sequence(jax.random.key(7), op, jnp.array([0.9]), a_t, a_s, 0.95)
  x, _ = fn(jax.random.split(jax.random.key(0), 16), op, y_start, ys, sigma)
  x = np.asarray(x, np.float64)
  m_ref, p_ref = fps.kalman_reference(MEAN0, COV0, a, sigma, y_start, ys, a_t, a_s, sampler="ddpm")
  means = x.mean(1)
  covs = np.stack([np.cov(xi.T) for xi in x])
  z_mean = (means.mean(0) - m_ref) / (means.std(0, ddof=1) / 4)
  z_cov = (covs.mean(0) - p_ref) / (covs.std(0, ddof=1) / 4)
  assert np.all(np.abs(z_mean) < 5), z_mean
  assert np.all(np.abs(z_cov) < 5), z_cov
  # The filter is informative: the posterior variance along A is far below the prior's.
  assert (a @ p_ref @ a.T)[0, 0] < 0.5 * (a @ COV0 @ a.T)[0, 0]


# ----------------------------------------------------- the exact posterior: noise tracking and telescoping


def _prior(dim):
  rng = np.random.default_rng(10 + dim)
  l = rng.standard_normal((dim, dim))
  return rng.standard_normal(dim) * 0.5, l @ l.T + 0.5 * np.eye(dim)


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


def test_measurement_sequence_cross_step_covariance():
  # For 0 < c < 1 the bridge is e_s = sqrt(1 - c) e_t + sqrt(c) A z on e = (y_t - sqrt(abar) y) / sqrt(1 - abar),
  # with Cov(e) = A A^T at every step, so Cov(y_i, y_j) = sqrt((1 - abar_i)(1 - abar_j)) (1 - c)^{|i-j|/2} A A^T.
  op = fps.Dense(np.array([[1.0, 0.5], [0.0, 2.0]]))
  a = np.asarray(op.a, np.float64)
  c, n = 0.5, 8000
  _, a_t, a_s = samplers.sampling_grid(SCHED, 20)
  y = jnp.array([0.7, -1.2])
  _, ys = jax.jit(jax.vmap(lambda k: fps.measurement_sequence(k, op, y, a_t, a_s, c)))(
      jax.random.split(jax.random.key(2), n))
  ys = np.asarray(ys, np.float64)
  ab = np.asarray(a_s, np.float64)
  aat = a @ a.T
  for i, j in ((8, 8), (8, 9), (8, 11)):
    emp = (ys[:, i] - ys[:, i].mean(0)).T @ (ys[:, j] - ys[:, j].mean(0)) / (n - 1)
    ref = np.sqrt((1 - ab[i]) * (1 - ab[j])) * (1 - c) ** (abs(i - j) / 2) * aat
    vi, vj = (1 - ab[i]) * np.diag(aat), (1 - ab[j]) * np.diag(aat)
    se = np.sqrt((np.outer(vi, vj) + ref ** 2) / n)
    assert np.all(np.abs(emp - ref) < 5 * se), (i, j, emp, ref)


@pytest.fixture(scope="module")
def weights_fn():
  """f(keys [R], rates [N], tele, op, y_start, ys) -> (particles [R, M, D], log_evidence [R], ess [R, N]) on a
  moderate-noise grid (abar from 0.6 to 1, sigma = 2): there rho = v |A|^2 / (abar_t sigma^2) <= 0.37 for both
  kernels, so the telescoping weights have a light tail (their variance is infinite for rho >= 1, as on the full
  grid where abar_T sigma^2 ~ 1e-5; see the README) and M = 2048 is in the asymptotic regime."""
  times, a_t, a_s = samplers.sampling_grid(SCHED, 100)
  keep = np.asarray(a_t) >= 0.6
  times, a_t, a_s = times[keep], a_t[keep], a_s[keep]
  fns = {}

  def get(dim):
    if dim not in fns:
      mean0, cov0 = _prior(dim)
      den = gmm_lib.gmm_denoiser(gmm_lib.GaussianMixture(
          jnp.ones(1), jnp.asarray(mean0[None], jnp.float32), jnp.asarray(cov0[None], jnp.float32)), SCHED)

      def run(keys, rates, tele, op, y_start, ys):
        def one(k):
          x, info = fps.particle_filter(k, den, op, y_start, ys, times, a_t, a_s, 2.0, 2048,
                                        resampling="systematic", rates=rates, weights=tele)
          return x, info["log_evidence"], info["ess"]
        return jax.vmap(one)(keys)

      fns[dim] = jax.jit(run)
    return fns[dim]

  return get, (a_t, a_s)


@pytest.mark.parametrize("dim", [1, 2])
def test_telescoping_weights_target_the_exact_posterior(weights_fn, dim):
  # The telescoping weights make the particles sample p_chain(x_0) N(y; A x_0, sigma^2): the exact posterior with
  # the sampler's own output law as prior (closed form: `telescoping_reference`); the log-evidence estimates
  # log p_chain(y). FPS's weights on the same sequence miss it (their limit is `kalman_reference`). Both kernels.
  get, (a_t, a_s) = weights_fn
  fn = get(dim)
  mean0, cov0 = _prior(dim)
  a = np.array([[1.0, 0.5][:dim]])
  op = fps.Dense(a)
  y = np.array([1.4])
  y_start, ys = fps.measurement_sequence(jax.random.key(7), op, jnp.asarray(y, jnp.float32), a_t, a_s, 0.95)
  reps = 8
  for sampler in ("ddpm", "ddim"):
    rates = fps.kernel_rates(sampler, 0.95, a_t, a_s)
    tm, tp = fps.telescoping_reference(mean0, cov0, a, 2.0, y, a_t, a_s, sampler=sampler)
    cm, cp = fps.chain_moments(mean0, cov0, a_t, a_s, sampler=sampler)
    s = a @ cp @ a.T + 4.0 * np.eye(1)
    log_py = float(-0.5 * (y - a @ cm) @ np.linalg.solve(s, y - a @ cm) - 0.5 * np.linalg.slogdet(2 * np.pi * s)[1])
    z = {}
    for tele in (1.0, 0.0):
      x, log_z, _ = fn(jax.random.split(jax.random.key(dim), reps), rates, jnp.float32(tele), op, y_start, ys)
      x = np.asarray(x, np.float64)
      means, covs = x.mean(1), np.stack([np.cov(xi.T).reshape(dim, dim) for xi in x])
      z_mean = (means.mean(0) - tm) / (means.std(0, ddof=1) / np.sqrt(reps) + 1e-12)
      z_cov = (covs.mean(0) - tp) / (covs.std(0, ddof=1) / np.sqrt(reps) + 1e-12)
      z[tele] = max(np.abs(z_mean).max(), np.abs(z_cov).max())
      if tele:
        lz = np.asarray(log_z, np.float64)
        assert abs(lz.mean() - log_py) < 5 * lz.std(ddof=1) / np.sqrt(reps) + 0.02, (lz, log_py)
    assert z[1.0] < 5, (sampler, z)
    assert z[0.0] > 5, (sampler, z)    # the test tells the two weightings apart


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


def test_sample_traces_once_and_shapes():
  op = fps.Dense(np.array([[1.0, 0.5]]))

  @jax.jit
  @chex.assert_max_traces(n=1)
  def f(key, y):
    return fps.sample(key, DEN, SCHED, op, y, 0.3, 6, 8, c=0.95, sampler="ddim", resampling="stratified",
                      ess_threshold=0.5, return_info=True, weights="telescoping")

  x, info = f(jax.random.key(0), jnp.array([0.4]))
  x2, _ = f(jax.random.key(1), jnp.array([-0.4]))
  chex.assert_shape([x, x2], (6, 2))
  chex.assert_tree_all_finite((x, x2))
  chex.assert_shape(info["ess"], (8,))
  chex.assert_shape(info["ys"], (8, 1))
  assert np.all(np.asarray(info["ess"]) <= 6 + 1e-4) and np.isfinite(float(info["log_evidence"]))


def test_sharded_images_match_one_device():
  # Independent measurements sharded over the 'data' axis: 8 devices give the particles of 1 device.
  from iclr24_jax.common import sharding
  op = fps.Dense(np.array([[1.0, 0.5]]))
  ys = jnp.linspace(-1.0, 1.0, 8)[:, None]
  keys = jax.random.split(jax.random.key(0), 8)
  outs = []
  for mesh in sharding.device_meshes((1, 8)):
    data = sharding.data_sharding(mesh)
    fn = jax.jit(jax.vmap(lambda k, y: fps.sample(k, DEN, SCHED, op, y, 0.3, 4, 6, resampling="systematic")),
                 in_shardings=(data, data), out_shardings=data)
    outs.append(np.asarray(fn(jax.device_put(keys, data), jax.device_put(ys, data))))
  chex.assert_shape(outs[0], (8, 4, 2))
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6, atol=1e-6)


def _unit_gaussian_denoiser(x, t):
  """Exact eps for data ~ N(0, I) of any shape: E[eps | x_t] = sqrt(1 - abar) x_t."""
  ab = SCHED.alpha_bar(t).reshape((-1,) + (1,) * (x.ndim - 1))
  return jnp.sqrt(1.0 - ab) * x


@pytest.mark.parametrize("name", ["inpainting", "gaussian_blur",
                                  pytest.param("super_resolution", marks=pytest.mark.slow),
                                  pytest.param("motion_blur", marks=pytest.mark.slow)])
def test_sample_on_image_operators(name):
  op = {"inpainting": fps.Inpainting(np.tile(np.eye(8)[..., None], (1, 1, 1))),
        "super_resolution": fps.SuperResolution(4, (8, 8, 1)),
        "gaussian_blur": fps.GaussianBlur(3, 1.0, (8, 8, 1)),
        "motion_blur": fps.MotionBlur(5, (8, 8, 1), angle=45.0)}[name]
  x0 = jax.random.normal(jax.random.key(0), (8, 8, 1))
  y = op.measure(jax.random.key(1), x0[None], 0.05)[0]
  fn = jax.jit(lambda k: fps.sample(k, _unit_gaussian_denoiser, SCHED, op, y, 0.05, 3, 6))
  x = programs.compile_call(fn, jax.random.key(2))(jax.random.key(2))   # XLA level 0: compile-bound
  chex.assert_shape(x, (3, 8, 8, 1))
  chex.assert_tree_all_finite(x)
  # the samples explain the measurement far better than the prior mean 0 does
  res = jnp.linalg.norm((op.forward(x) - y).reshape(3, -1), axis=1)
  assert float(jnp.max(res)) < float(jnp.linalg.norm(y))


# ----------------------------------------------------------------------------------------------- DPS


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


# ---------------------------------------------------------------------------------------------- errors


def test_clear_errors():
  op = fps.Dense(np.array([[1.0, 0.5]]))
  call = lambda **kw: fps.sample(jax.random.key(0), DEN, SCHED, op, kw.pop("y", jnp.array([0.1])),  # noqa: E731
                                 kw.pop("sigma", 0.1), 2, 3, **kw)
  with pytest.raises(ValueError, match="y has shape"):
    call(y=jnp.zeros((2,)))
  with pytest.raises(ValueError, match="sigma must be > 0"):
    call(sigma=0.0)
  with pytest.raises(ValueError, match="c must be in"):
    call(c=1.5)
  with pytest.raises(ValueError, match="unknown sampler"):
    call(sampler="euler")
  with pytest.raises(ValueError, match="unknown resampling"):
    call(resampling="residual")
  with pytest.raises(ValueError, match="c=None"):
    call(c=None, sampler="ddim")
  with pytest.raises(ValueError, match="NaN"):
    call(y=jnp.array([jnp.nan]))
  with pytest.raises(ValueError, match="ess_threshold"):
    call(ess_threshold=1.5)
  with pytest.raises(ValueError, match="unknown weights"):
    call(weights="tempered")
  with pytest.raises(ValueError, match="sigma must be > 0"):
    fps.noise_tracking_kalman(np.zeros(2), np.eye(2), np.ones((1, 2)), 0.0, np.zeros(1), np.zeros((3, 1)),
                              np.full(3, 0.5), np.ones(3))
  with pytest.raises(ValueError, match="one measurement per step"):
    fps.noise_tracking_kalman(np.zeros(2), np.eye(2), np.ones((1, 2)), 0.1, np.zeros(1), np.zeros((2, 1)),
                              np.full(3, 0.5), np.ones(3))
  with pytest.raises(ValueError, match="unknown sampler"):
    fps.telescoping_reference(np.zeros(2), np.eye(2), np.ones((1, 2)), 0.1, np.zeros(1), np.full(3, 0.5),
                              np.ones(3), sampler="euler")
  with pytest.raises(TypeError, match="fps operator"):
    fps.sample(jax.random.key(0), DEN, SCHED, np.eye(2), jnp.zeros(2), 0.1, 2, 3)
  with pytest.raises(ValueError, match="divide"):
    fps.SuperResolution(3, (8, 8, 1))
  with pytest.raises(ValueError, match="odd"):
    fps.GaussianBlur(4, 1.0, (8, 8))
  with pytest.raises(ValueError, match="larger than the image"):
    fps.MotionBlur(9, (8, 8))
  with pytest.raises(ValueError, match="0/1"):
    fps.Inpainting(np.full((2, 2), 0.5))
  with pytest.raises(ValueError, match="2-D matrix"):
    fps.Dense(np.zeros(3))
  with pytest.raises(ValueError, match="must end in shape"):
    fps.SuperResolution(2, (4, 4)).forward(jnp.zeros((3, 3)))


# ----------------------------------------------------------------------------------- config, prior, run


def test_config_variants():
  for v in fps_config.VARIANTS:
    c = fps_config.get_config(v)
    assert c.paper == "fps"
    for field in ("seed", "model", "optimizer", "num_steps", "data", "log_every", "eval_every", "checkpoint_every",
                  "mesh"):
      assert field in c
  assert fps_config.get_config("super_resolution").images.tasks == ("super_resolution",)
  assert fps_config.get_config("official").fps.sampler == "ddim"
  with pytest.raises(ValueError, match="unknown variant"):
    fps_config.get_config("ffhq")


def test_prior_train_step_lowers_loss():
  import optax
  from iclr24_jax.diffusion import train, unet
  cfg = fps_config.get_config("tiny_images")
  model = unet.create_model(cfg.model)
  x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (16, 16, 16, 1)), jnp.float32)
  tx = optax.adam(3e-3)
  state0 = jax.jit(lambda k: train.init(k, model, (16, 16, 1), tx))(jax.random.key(0))
  traced_step = chex.assert_max_traces(train.make_train_step(model, SCHED), n=1)
  # one compile at XLA level 0 (compile-bound on CPU; values agree with the default level to rounding)
  step = programs.compile_call(jax.jit(traced_step), state0, {"x": x}, jax.random.key(1))
  state = state0
  for _ in range(20):
    state, _ = step(state, {"x": x}, jax.random.key(1))   # the step folds state.step into the key
  # the same fixed (t, eps) draw before and after training
  loss_fn = jax.jit(lambda p: train.diffusion_loss(lambda xt, t: model.apply({"params": p}, xt, t), x,
                                                      jax.random.key(9), SCHED)[0])
  loss = programs.compile_call(loss_fn, state0.params)
  assert float(loss(state.params)) < float(loss(state0.params))


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


def test_run_tiny_smoke(tmp_path):
  cfg = fps_config.get_config("tiny")
  res = experiment.run(cfg, str(tmp_path), progress=False)
  assert os.path.exists(tmp_path / "results.json")
  for p in res["exactness"]["plots"] + res["gaussian_limit"]["plots"]:
    assert os.path.exists(p)
  r2 = res["exactness"]["dims"][2]
  assert set(r2["fps"]) == {"ddpm c=0.95", "ddpm c=0.95 sigma=0.05", "ddpm c=0.95 telescoping",
                            "ddpm c=0.95 telescoping sigma=0.05"}
  assert all(np.isfinite(v) for v in r2["fps"]["ddpm c=0.95"][4].values())
  seeds = r2["fps_seeds"]["ddpm c=0.95 telescoping"][4]
  assert all(len(v) == cfg.exactness.num_seeds and np.all(np.isfinite(v)) for v in seeds.values())
  # DPS: one zeta in the tiny grid, chosen on validation runs; the test runs' metrics are those reported
  dps = r2["dps"]["main"]
  assert dps["zeta"] == 0.3 and set(dps["val_sw_by_zeta"]) == {0.3}
  assert dps["test"]["sw_ratio"] == dps["test_sw_ratio_by_zeta"][0.3] and np.isfinite(dps["test"]["sw"])
  # the Gaussian limit: the noise-tracking filter is the exact posterior on FPS's own sequences
  nt = [r for r in res["gaussian_limit"]["rows"] if r["filter"] == "noise_tracking"]
  assert nt and all(abs(r["obs_var_ratio"] - 1) < 1e-6 for r in nt)


def test_split_images_keeps_validation_apart_from_the_test_images():
  """Test images = the generator's first draw (the same whatever the validation count, so earlier rows' test set is
  kept); validation images come from the rest of the pool: no image is in both."""
  pool = np.arange(40, dtype=np.float32).reshape(40, 1, 1, 1)    # image i is the value i
  test, val = study_images.split_images(pool, 12, 8, seed=0)
  want = pool[np.random.default_rng(0).choice(40, 12, replace=False)]
  np.testing.assert_array_equal(test, want)
  np.testing.assert_array_equal(study_images.split_images(pool, 12, 0, seed=0)[0], want)
  assert val.shape == (8, 1, 1, 1) and not set(val.ravel()) & set(test.ravel())
  assert len(set(val.ravel())) == 8
  with pytest.raises(ValueError, match="num_val_images"):
    study_images.split_images(pool, 35, 8, seed=0)


def test_dps_step_size_is_never_tuned_on_the_test_images(tmp_path):
  """Several DPS step sizes and no validation images: refused before the prior is trained."""
  cfg = fps_config.get_config("tiny_images")
  cfg.images.methods = ("fps", "dps")
  cfg.images.dps_zetas = (0.3, 1.0)
  cfg.images.num_val_images = 0
  with pytest.raises(ValueError, match="validation images"):
    study_images.image_study(cfg, str(tmp_path), progress=False)
  assert not (tmp_path / "prior").exists()
  assert fps_config.get_config("images").images.num_val_images > 0


@pytest.mark.slow
def test_run_tiny_images_smoke(tmp_path):
  """The image path end to end; DPS picks its step size on 2 validation images (the best mean PSNR there) and runs
  the test images at that step size, with FPS's number of steps."""
  cfg = fps_config.get_config("tiny_images")
  cfg.images.methods = ("fps", "pinv", "dps")
  cfg.images.dps_zetas = (0.3, 3.0)
  cfg.images.num_val_images = 2
  res = experiment.run(cfg, str(tmp_path), progress=False)
  task = res["images"]["tasks"]["inpainting"]
  sc = task["scores"]
  assert set(sc) == {"fps", "pinv", "dps"} and all(np.isfinite(v["psnr"]) for v in sc.values())
  val = task["dps_val_psnr_by_zeta"]
  assert set(val) == {0.3, 3.0} and task["dps_zeta"] == max(val, key=val.get)
  assert res["images"]["num_val_images"] == 2 and res["images"]["num_steps"] == cfg.fps.num_steps
  assert os.path.exists(tmp_path / "images.png")
