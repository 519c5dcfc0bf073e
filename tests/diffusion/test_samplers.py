"""Samplers (`diffusion/samplers.py`) with the analytic Gaussian-mixture denoiser: exactness (sliced
W2, moments, weights, a wrong-schedule control), single steps, DDIM / DDPM kernels, guidance,
per-level sampling, errors."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal

from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import metrics, process, samplers, schedules


N = 4096              # samples per sampler run
SW_BOUND = 2.5        # sliced-W2 bound, in units of the data-vs-data floor (see test_gmm_2d_sliced_wasserstein)
SE = 5.0              # moment checks allow 5 standard errors


@functools.partial(jax.jit, static_argnames=("n",))
def _data(g, key, n):
  return g.sample(key, n)


@functools.partial(jax.jit, static_argnames=("n", "method", "num_steps", "prediction", "eta"))
def _sample(g, den_schedule, samp_schedule, key, n, method, num_steps=None, prediction="eps", eta=0.0):
  den = gmm_lib.gmm_denoiser(g, den_schedule, prediction)
  return samplers.sample(key, den, samp_schedule, (n, g.dim), method=method, num_steps=num_steps,
                         prediction=prediction, eta=eta)


@pytest.fixture(scope="module")
def ring_samples(ring, lin, cos):
  key = jax.random.key(11)
  return {
      "ddpm": _sample(ring, lin, lin, key, N, "ddpm"),
      "ddim": _sample(ring, lin, lin, key, N, "ddim", 100),
      # Negative control: the denoiser is exact for the linear schedule, the sampler walks the cosine one.
      "wrong": _sample(ring, lin, cos, key, N, "ddim", 100),
  }


@jax.jit
def _moment_stats(g, x, ref):
  """Sample mean, covariance, component frequencies of x [N, D]; exact moments; SE of covariance entries."""
  mean, cov = g.mean(), g.covariance()
  r = ref - mean
  # SE of each covariance entry, from a large data draw: std((x_i - m_i)(x_j - m_j)) / sqrt(n).
  se_cov = jnp.std(r[:, :, None] * r[:, None, :], axis=0) / jnp.sqrt(x.shape[0])
  return (jnp.mean(x, 0), jnp.cov(x, rowvar=False), metrics.component_frequencies(g, x), mean, cov, se_cov)


def _check_moments(g, x, ref):
  """Mean, covariance and mixture weights of samples x [N, D] within SE standard errors of the exact values."""
  n = x.shape[0]
  mean_hat, cov_hat, freq, mean, cov, se_cov = (np.asarray(a, np.float64) for a in _moment_stats(g, x, ref))
  np.testing.assert_array_less(np.abs(mean_hat - mean), SE * np.sqrt(np.diag(cov) / n))
  np.testing.assert_array_less(np.abs(cov_hat - cov), SE * se_cov)
  w = np.asarray(g.weights, np.float64)
  np.testing.assert_array_less(np.abs(freq - w), SE * np.sqrt(w * (1 - w) / n))


@pytest.fixture(scope="module")
def ring_ref(ring):
  return _data(ring, jax.random.key(3), 50_000)


@functools.partial(jax.jit, static_argnames=("n",))
def _sw_vs_data(g, x, key, n):
  return metrics.sliced_wasserstein_vs_data(x, lambda k, m: g.sample(k, m), key, num_refs=4, num_projections=128)


def test_gmm_2d_sliced_wasserstein(ring, ring_samples):
  """Sliced W2 to 4 data draws, in units of the floor (4 data-vs-data distances at the same N).

  An exact sampler has ratio ~1: with 8 fresh data draws in place of the samples the ratio (same key) fell within
  0.73-0.86; DDPM / DDIM samples from 4 seeds gave 0.71-1.20. The bound SW_BOUND = 2.5 leaves room for that
  spread and the samplers' discretisation error; the sampler on the wrong schedule sits at ~5.4.
  """
  ratio = {}
  for name, x in ring_samples.items():
    sw, floor = _sw_vs_data(ring, x, jax.random.key(2), N)
    ratio[name] = float(sw / floor)
  assert ratio["ddpm"] < SW_BOUND, ratio
  assert ratio["ddim"] < SW_BOUND, ratio
  # The check has power: a sampler on the wrong schedule fails it.
  assert ratio["wrong"] > SW_BOUND, ratio


@pytest.mark.parametrize("method", ["ddpm", "ddim"])
def test_gmm_2d_moments_and_weights(ring, ring_samples, ring_ref, method):
  _check_moments(ring, ring_samples[method], ring_ref)


def test_gmm_2d_wrong_schedule_fails_moments(ring, ring_samples, ring_ref):
  with pytest.raises(AssertionError):
    _check_moments(ring, ring_samples["wrong"], ring_ref)


@pytest.mark.parametrize("method,num_steps", [("ddpm", None), ("ddim", 100)])
def test_gmm_8d_moments_and_weights(gmm8, lin, method, num_steps):
  x = _sample(gmm8, lin, lin, jax.random.key(12), N // 2, method, num_steps)
  _check_moments(gmm8, x, _data(gmm8, jax.random.key(4), 50_000))


def test_gmm_continuous_cosine_v_prediction(ring, ring_ref):
  # Continuous time (MDM's cosine log-SNR), a v-predicting denoiser, DDIM with 100 steps.
  c = schedules.ContinuousSchedule("cosine")
  x = _sample(ring, c, c, jax.random.key(13), N, "ddim", 100, "v")
  _check_moments(ring, x, ring_ref)


def test_prediction_types_give_the_same_sampler(ring, lin):
  # The exact denoiser expressed as eps, x0 or v drives the same chain (conversions are exact up to float32).
  key = jax.random.key(5)
  x_eps = _sample(ring, lin, lin, key, 256, "ddim", 20, "eps")
  for pred in ("x0", "v"):
    np.testing.assert_allclose(_sample(ring, lin, lin, key, 256, "ddim", 20, pred), x_eps, atol=2e-3)


def test_single_steps_compose_to_the_sampler(ring, lin):
  """`sample` equals a Python loop of `sampler_step` with the same keys (DDPM and DDIM(eta=0.5), v-prediction)."""
  den = gmm_lib.gmm_denoiser(ring, lin, "v")
  key = jax.random.key(6)
  for method, kw in (("ddpm", {}), ("ddim", {"eta": 0.5})):
    full, traj = samplers.sample(key, den, lin, (64, 2), method=method, num_steps=20, prediction="v",
                                 return_trajectory=True, **kw)
    times, a_t, a_s = samplers.sampling_grid(lin, 20)
    key_init, step_keys = samplers.split_sampler_keys(key, 20)
    x = jax.random.normal(key_init, (64, 2))  # as `sample` draws x_T
    step = jax.jit(functools.partial(samplers.sampler_step, den, method=method, prediction="v", **kw))
    for i in range(20):
      x, tr = step(x, times[i], a_t[i], a_s[i], step_keys[i])
      np.testing.assert_allclose(x, traj[i], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x, full, rtol=1e-5, atol=1e-5)
    # The last step lands on the x0 estimate with zero variance.
    np.testing.assert_allclose(tr.var, 0.0, atol=0)
    np.testing.assert_allclose(x, tr.x0, rtol=1e-6)


def test_ddim_eta1_equals_ddpm_kernel_and_eta0_is_deterministic(lin):
  rng = np.random.default_rng(7)
  xt = rng.standard_normal((8, 3)).astype(np.float32)
  eps = rng.standard_normal((8, 3)).astype(np.float32)
  a_t, a_s = lin.alpha_bar(500), lin.alpha_bar(450)
  ddpm = samplers.ddpm_transition(xt, eps, a_t, a_s)
  ddim1 = samplers.ddim_transition(xt, eps, a_t, a_s, eta=1.0)
  # DDIM Eq. (16) with eta = 1 is beta-tilde, and Eq. (12)'s mean then equals the posterior mean (DDPM Eq. 7).
  np.testing.assert_allclose(ddim1.var, ddpm.var, rtol=1e-5)
  np.testing.assert_allclose(ddim1.mean, ddpm.mean, rtol=1e-4, atol=1e-5)
  ddim0 = samplers.ddim_transition(xt, eps, a_t, a_s, eta=0.0)
  assert float(ddim0.var) == 0.0
  # Eq. (12) by hand: sqrt(abar_s) x0 + sqrt(1 - abar_s) eps with x0 = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t).
  x0 = (xt - np.sqrt(1 - a_t) * eps) / np.sqrt(a_t)
  np.testing.assert_allclose(ddim0.mean, np.sqrt(a_s) * x0 + np.sqrt(1 - a_s) * eps, rtol=1e-5, atol=1e-5)
  # DDPM Eq. (11): mu = (x_t - beta / sqrt(1 - abar_t) eps) / sqrt(alpha) for consecutive steps.
  one = samplers.ddpm_transition(xt, eps, lin.alpha_bar(500), lin.alpha_bar(499))
  mu = (xt - lin.betas[500] / np.sqrt(1 - lin.alpha_bars[500]) * eps) / np.sqrt(lin.alphas[500])
  np.testing.assert_allclose(one.mean, mu, rtol=1e-4, atol=1e-5)
  beta = samplers.ddpm_transition(xt, eps, lin.alpha_bar(500), lin.alpha_bar(499), variance="beta")
  np.testing.assert_allclose(beta.var, lin.betas[500], rtol=1e-3)
  # Transition.log_prob is the Gaussian density.
  x = ddpm.sample(jax.random.key(0))
  np.testing.assert_allclose(ddpm.log_prob(x), multivariate_normal(np.zeros(3), float(ddpm.var) * np.eye(3))
                             .logpdf(np.asarray(x - ddpm.mean)), rtol=1e-5)


def test_clip_x0_keeps_estimates_consistent():
  xt = jnp.array([[3.0, -0.2]])
  tr = samplers.ddim_transition(xt, jnp.array([[-2.0, 0.1]]), 0.5, 0.9, clip_x0=1.0)
  assert float(jnp.max(jnp.abs(tr.x0))) <= 1.0
  np.testing.assert_allclose(process.eps_to_x0(xt, tr.eps, 0.5), tr.x0, rtol=1e-5)


def test_classifier_free_guidance():
  # den(x, t, c) = c * x: guided = u + w (c - u) with u = null.
  den = lambda x, t, c: c[:, None] * x  # noqa: E731
  x = jnp.ones((3, 2))
  cond, null = jnp.array([1.0, 2.0, 3.0]), jnp.zeros((1,))
  g = samplers.classifier_free_guidance(den, cond, null, 1.5)(x, jnp.zeros(3))
  np.testing.assert_allclose(g, 1.5 * cond[:, None] * x, rtol=1e-6)
  # guidance_scale = 1 reproduces the plain conditional sampler.
  sched = schedules.linear_beta_schedule(50)
  den2 = lambda x, t, c: 0.1 * x + c[:, None]  # noqa: E731
  a = samplers.sample(jax.random.key(0), den2, sched, (3, 2), cond=cond)
  b = samplers.sample(jax.random.key(0), den2, sched, (3, 2), cond=cond, null_cond=null, guidance_scale=1.0)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_classifier_free_guidance_on_pytrees():
  # A two-level denoiser: level r returns (r + 1) * c * x_r; guided = u + w (c - u) on every level, u = null = 0.
  def den(xs, t, c):
    return tuple((r + 1) * c[:, None] * x for r, x in enumerate(xs))

  xs = (jnp.ones((3, 2)), 2.0 * jnp.ones((3, 5)))
  cond, null = jnp.array([1.0, 2.0, 3.0]), jnp.zeros((1,))
  g = samplers.classifier_free_guidance(den, cond, null, 1.5)(xs, jnp.zeros(3))
  assert isinstance(g, tuple) and len(g) == 2
  np.testing.assert_allclose(g[0], 1.5 * cond[:, None] * xs[0], rtol=1e-6)
  np.testing.assert_allclose(g[1], 1.5 * 2 * cond[:, None] * xs[1], rtol=1e-6)


def test_sample_levels_matches_per_level_samplers():
  """Independent levels, each with its own (shifted) schedule: the joint scan equals one `sample` per level.

  DDIM with eta = 0 is deterministic given x_T, so the per-level chains must agree to float32 round-off; the
  levels' schedules differ (log-SNR shifted by -2 log 4), so a level run on the other's noise levels would differ.
  """
  base = schedules.squaredcos_cap_v2(100)
  low = schedules.shift_schedule(base, 0.0)
  high = schedules.shift_schedule(base, schedules.resolution_shift(8, 32))
  den_h = lambda x, t: 0.3 * x + 0.01 * t[:, None].astype(jnp.float32)  # noqa: E731
  den_l = lambda x, t: -0.2 * x  # noqa: E731
  joint = lambda xs, t: (den_h(xs[0], t), den_l(xs[1], t))  # noqa: E731
  rng = np.random.default_rng(0)
  x_T = (jnp.asarray(rng.standard_normal((4, 6)), jnp.float32), jnp.asarray(rng.standard_normal((4, 3)), jnp.float32))
  out = samplers.sample_levels(jax.random.key(0), joint, (high, low), [(4, 6), (4, 3)], method="ddim",
                               num_steps=10, x_T=x_T)
  ref_h = samplers.sample(jax.random.key(1), den_h, high, (4, 6), method="ddim", num_steps=10, x_T=x_T[0])
  ref_l = samplers.sample(jax.random.key(1), den_l, low, (4, 3), method="ddim", num_steps=10, x_T=x_T[1])
  np.testing.assert_allclose(out[0], ref_h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out[1], ref_l, rtol=1e-5, atol=1e-5)
  wrong = samplers.sample(jax.random.key(1), den_h, low, (4, 6), method="ddim", num_steps=10, x_T=x_T[0])
  assert float(jnp.max(jnp.abs(wrong - ref_h))) > 1e-2
  # DDPM: stochastic; shapes per level, and a mismatched schedule list is an error.
  xs = samplers.sample_levels(jax.random.key(0), joint, (high, low), [(4, 6), (4, 3)], method="ddpm", num_steps=5)
  chex.assert_shape(list(xs), [(4, 6), (4, 3)])
  with pytest.raises(ValueError, match="one shape per schedule"):
    samplers.sample_levels(jax.random.key(0), joint, (high,), [(4, 6), (4, 3)])
  with pytest.raises(ValueError, match="time units"):
    samplers.sample_levels(jax.random.key(0), joint, (high, schedules.squaredcos_cap_v2(50)), [(4, 6), (4, 3)])


def test_samplers_are_shape_agnostic():
  sched = schedules.linear_beta_schedule(20)
  den = lambda x, t: 0.5 * x  # noqa: E731
  for shape in ((4, 7), (2, 4, 4, 3)):
    chex.assert_shape(samplers.sample(jax.random.key(0), den, sched, shape, method="ddim", num_steps=5), shape)


def test_sampler_errors(lin):
  den = lambda x, t: x  # noqa: E731
  with pytest.raises(ValueError, match="unknown sampler"):
    samplers.sample(jax.random.key(0), den, lin, (2, 2), method="euler")
  with pytest.raises(ValueError, match="null_cond"):
    samplers.sample(jax.random.key(0), lambda x, t, c: x, lin, (2, 2), cond=jnp.zeros(2), guidance_scale=2.0)
  with pytest.raises(ValueError, match="x_T has shape"):
    samplers.sample(jax.random.key(0), den, lin, (2, 2), x_T=jnp.zeros((3, 2)))
  with pytest.raises(ValueError, match="denoiser returned shape"):
    samplers.sample(jax.random.key(0), lambda x, t: x[:, :1], lin, (2, 2), num_steps=2)
  with pytest.raises(ValueError, match="variance"):
    samplers.ddpm_transition(jnp.zeros((1, 2)), jnp.zeros((1, 2)), 0.5, 0.6, variance="learned")
  with pytest.raises(ValueError, match=r"\[B, 2\]"):
    gmm_lib.ring_gmm().score(jnp.zeros((3, 5)), 0.5)
  with pytest.raises(ValueError, match=r"y must be \[N, D\] with N = 3"):
    metrics.sliced_wasserstein(jnp.zeros((3, 2)), jnp.zeros((4, 2)), jax.random.key(0))
