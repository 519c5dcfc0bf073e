"""FPS's filter (`papers/fps/smc.py`): the closed-form conditioning against dense linear algebra, the
weight as the marginal likelihood, the kernel rates, the measurement sequence's marginals and
cross-step covariance, the particle filter against an exact Kalman filter, the telescoping weights
against the exact posterior, `sample` (one trace, 1 vs 8 devices, image operators) and its errors."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import samplers
from iclr24_jax.papers import fps
from iclr24_jax.papers.fps import programs
from .helpers import SCHED, OPS, _basis_matrix, MEAN0, COV0, DEN, N_STEPS, _prior


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
