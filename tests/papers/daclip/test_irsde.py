"""DA-CLIP's IR-SDE (`papers/daclip/irsde.py`): the schedule against the official definitions, the
closed-form marginal against simulation, the bridge posterior, the matching loss, and the reverse
chains with the true noise: clean image restored, the spread of a Gaussian posterior, the mean of K
posterior chains."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import daclip


def test_schedule_matches_official_definitions(sde):
  # lambda = 50 / 255 (values >= 1 are 8-bit units); dt chosen so that exp(-theta_bar_T dt) = 0.005.
  np.testing.assert_allclose(float(sde.lambda_), 50 / 255, rtol=1e-6)
  np.testing.assert_allclose(float(daclip.irsde.mean_factor(100, sde)), 0.005, rtol=1e-5)
  assert float(sde.thetas_cumsum[0]) == 0.0 and float(sde.sigma_bars[0]) == 0.0
  # sigma_t^2 = 2 lambda^2 theta_t, and the terminal std is lambda sqrt(1 - 0.005^2).
  np.testing.assert_allclose(np.asarray(sde.sigmas) ** 2, 2 * (50 / 255) ** 2 * np.asarray(sde.thetas), rtol=1e-5)
  np.testing.assert_allclose(float(sde.sigma_bars[-1]), 50 / 255 * math.sqrt(1 - 0.005 ** 2), rtol=1e-5)
  # Cosine thetas, by hand for T = 1: n = 3, abar(x) = cos(((x / 3) + s) / (1 + s) pi / 2)^2 / abar(0),
  # thetas = 1 - abar(1), 1 - abar(2).
  s = 0.008
  f = lambda x: math.cos(((x / 3) + s) / (1 + s) * math.pi / 2) ** 2  # noqa: E731
  np.testing.assert_allclose(np.asarray(daclip.irsde.cosine_thetas(1)), [1 - f(1) / f(0), 1 - f(2) / f(0)],
                             rtol=1e-5)
  with pytest.raises(ValueError, match="eps"):
    daclip.irsde_schedule(eps=0.0)
  with pytest.raises(ValueError, match="schedule"):
    daclip.irsde_schedule(schedule="sigmoid")


def test_forward_marginal_matches_monte_carlo_simulation(sde):
  """Simulates dx = theta_t (mu - x) dt + sigma_t dW with 20 Euler-Maruyama sub-steps per interval (theta is
  piecewise constant on each interval, as the closed form assumes) for 20,000 paths and compares mean and
  variance at t = 10, 50, 100 with m_t and v_t of Eq. (5)."""
  x0, mu, n_paths, sub = 0.9, 0.2, 20000, 20
  key = jax.random.key(0)

  @jax.jit
  def simulate(key):
    def interval(x, inp):
      t, k = inp
      h = sde.dt / sub

      def substep(x, kk):
        dw = jnp.sqrt(h) * jax.random.normal(kk, x.shape)
        return x + sde.thetas[t] * (mu - x) * h + sde.sigmas[t] * dw, None

      x, _ = jax.lax.scan(substep, x, jax.random.split(k, sub))
      return x, x

    ts = jnp.arange(1, 101)
    _, xs = jax.lax.scan(interval, jnp.full((n_paths,), x0), (ts, jax.random.split(key, 100)))
    return xs                                                               # [100, n_paths], xs[t-1] = x_t

  xs = np.asarray(simulate(key), np.float64)
  for t in (10, 50, 100):
    m = float(daclip.irsde_mean(jnp.asarray(x0), jnp.asarray(mu), t, sde))
    sd = float(daclip.irsde_std(t, sde))
    emp_m, emp_v = xs[t - 1].mean(), xs[t - 1].var()
    # Monte-Carlo standard errors: sd / sqrt(n) for the mean, v sqrt(2 / n) for the variance; 4 se + 1%
    # for the Euler sub-step bias (theta dt / 20 <= 0.005 per sub-step).
    assert abs(emp_m - m) < 4 * sd / math.sqrt(n_paths) + 0.01 * abs(x0 - mu), (t, emp_m, m)
    assert abs(emp_v - sd ** 2) < 4 * sd ** 2 * math.sqrt(2 / n_paths) + 0.01 * sd ** 2, (t, emp_v, sd ** 2)
  # The closed-form sampler draws from the same marginal.
  draws = np.asarray(daclip.irsde_forward_sample(jax.random.key(1), jnp.full((n_paths,), x0), jnp.full((n_paths,), mu),
                                                 50, sde))
  assert abs(draws.mean() - xs[49].mean()) < 6 * float(sde.sigma_bars[50]) / math.sqrt(n_paths)


def test_optimal_reverse_step_is_the_gaussian_bridge_posterior(sde):
  """x*_{t-1} and its std equal the posterior of x_{t-1} given (x_t, x0) obtained by conditioning the joint
  Gaussian of (x_{t-1}, x_t) | x0: x_{t-1} ~ N(m_{t-1}, v_{t-1}), x_t = mu + A (x_{t-1} - mu) + N(0, lam^2 (1 - A^2)),
  A = exp(-theta_t dt). Posterior mean m_{t-1} + Cov / Var(x_t) (x_t - m_t), var v_{t-1} - Cov^2 / Var(x_t)."""
  lam2 = float(sde.lambda_) ** 2
  dt = float(sde.dt)
  rng = np.random.default_rng(0)
  x0, mu, xt = rng.normal(size=(3, 8))
  for t in (1, 2, 37, 100):
    a = math.exp(-float(sde.thetas[t]) * dt)
    m_prev = mu + (x0 - mu) * math.exp(-float(sde.thetas_cumsum[t - 1]) * dt)
    v_prev = lam2 * (1 - math.exp(-2 * float(sde.thetas_cumsum[t - 1]) * dt))
    m_t = mu + a * (m_prev - mu)
    var_t = a * a * v_prev + lam2 * (1 - a * a)
    cov = a * v_prev
    post_mean = m_prev + cov / var_t * (xt - m_t)
    post_var = v_prev - cov ** 2 / var_t
    got = daclip.optimal_reverse_step(jnp.asarray(xt), jnp.asarray(x0), jnp.asarray(mu), t, sde)
    np.testing.assert_allclose(np.asarray(got), post_mean, rtol=2e-4, atol=2e-5)
    if t > 1:   # at t = 1 the posterior is a point mass (v_0 = 0); the official floor keeps it tiny
      np.testing.assert_allclose(float(daclip.optimal_reverse_std(t, sde)) ** 2, post_var, rtol=2e-3)
  # Its marginal var also matches the simulation variance v_t = lam^2 (1 - B^2) at t.
  np.testing.assert_allclose(var_t, float(sde.sigma_bars[100]) ** 2, rtol=1e-4)
  # Per-sample times broadcast: [B] t against [B, H, W, C] images.
  x = jnp.ones((2, 4, 4, 1))
  out = daclip.optimal_reverse_step(x, 0 * x, 0.5 * x, jnp.asarray([1, 100]), sde)
  chex.assert_shape(out, (2, 4, 4, 1))


def test_perfect_noise_makes_the_matching_loss_zero_at_the_first_step(sde):
  # At t = 1 the optimal step returns x0 exactly (C = 1); x0_from_noise with the true noise recovers x0 at any t.
  rng = np.random.default_rng(1)
  x0, mu, z = (jnp.asarray(rng.random((2, 4, 4, 1)), jnp.float32) for _ in range(3))
  t = jnp.asarray([1, 60])
  xt = daclip.irsde_mean(x0, mu, t, sde) + sde.sigma_bars[t][:, None, None, None] * z
  np.testing.assert_allclose(np.asarray(daclip.x0_from_noise(xt, z, mu, t, sde)), np.asarray(x0), atol=2e-4)
  np.testing.assert_allclose(np.asarray(daclip.optimal_reverse_step(xt, x0, mu, 1, sde))[0], np.asarray(x0)[0],
                             atol=1e-5)
  # The L1 matching loss is |reverse_sde_mean - x*| averaged; with the true noise it is the Euler error of
  # one step only: small next to the loss of a zero prediction.
  true_loss = float(daclip.matching_loss(z, xt, x0, mu, t, sde))
  zero_loss = float(daclip.matching_loss(jnp.zeros_like(z), xt, x0, mu, t, sde))
  assert true_loss < 0.2 * zero_loss


@pytest.mark.parametrize("method", ["sde", "posterior"])
def test_reverse_sample_with_the_true_noise_restores_the_clean_image(method):
  # The reference that rules out a sampler bug behind a weak restoration row: feed reverse_sample the exact noise
  # of x_t given the clean image, eps_t = (x_t - m_t(x0, mu)) / sigma_bar_t; the reverse IR-SDE must then end at
  # x0 from x_T = mu + lambda z, up to the Euler error of 100 steps (the official schedule and lambda).
  sched = daclip.irsde_schedule(T=100, lambda_=50.0 / 255.0, eps=0.005)
  rng = np.random.default_rng(3)
  x0 = jnp.asarray(rng.random((4, 8, 8, 1)), jnp.float32)
  mu = jnp.clip(x0 + 0.3 * jnp.asarray(rng.standard_normal((4, 8, 8, 1)), jnp.float32), 0.0, 1.0)  # "degraded"

  def oracle(params, x_t, mu_, t):
    sig = sched.sigma_bars[t][:, None, None, None]
    return (x_t - daclip.irsde_mean(x0, mu_, t, sched)) / jnp.maximum(sig, 1e-12)

  out = jax.jit(lambda k: daclip.reverse_sample(k, None, mu, noise_fn=oracle, schedule=sched, method=method))(
      jax.random.key(0))
  rms_out = float(jnp.sqrt(jnp.mean((out - x0) ** 2)))
  rms_in = float(jnp.sqrt(jnp.mean((mu - x0) ** 2)))
  assert rms_in > 0.2
  assert rms_out < 0.03, (rms_out, rms_in)


def _gaussian_chain_std(sched, s, method, scale=1.0):
  """Exact output std of the reverse chain for Gaussian data x0 ~ N(mu, s^2) with the exact noise prediction
  eps_hat = scale sqrt(v_t) (x_t - mu) / (B_t^2 s^2 + v_t), B_t = exp(-theta_bar_t dt), v_t = sigma_bar_t^2: every
  step is linear, y_{t-1} = g_t y_t + sd_t n (y = x - mu), so Var_{t-1} = g_t^2 Var_t + sd_t^2, from Var_T =
  lambda^2. numpy, float64, from the official formulas (sde_utils.py: reverse_sde_step, reverse_posterior_step =
  get_init_state_from_noise + reverse_optimum_step + reverse_optimum_std)."""
  th, thb = np.asarray(sched.thetas, np.float64), np.asarray(sched.thetas_cumsum, np.float64)
  sig, sb, dt, lam = np.asarray(sched.sigmas, np.float64), np.asarray(sched.sigma_bars, np.float64), sched.dt, \
      sched.lambda_
  var = lam ** 2
  for t in range(sched.num_steps, 0, -1):
    b, v = np.exp(-thb[t] * dt), sb[t] ** 2
    k = scale * np.sqrt(v) / (b ** 2 * s ** 2 + v)                     # eps_hat = k y
    if method == "sde":          # x - (theta (mu - x) - sigma^2 score) dt - sigma sqrt(dt) n, score = -eps / sqrt(v)
      g, sd2 = 1 + th[t] * dt - sig[t] ** 2 * k / np.sqrt(v) * dt, sig[t] ** 2 * dt
    else:                        # x0_hat - mu = (1 - sqrt(v) k) e^{theta_bar dt} y, then the bridge posterior
      a, c = np.exp(-th[t] * dt), np.exp(-thb[t - 1] * dt)
      x0k = (1 - np.sqrt(v) * k) * np.exp(thb[t] * dt)
      g = a * (1 - c ** 2) / (1 - b ** 2) + c * (1 - a ** 2) / (1 - b ** 2) * x0k
      sd2 = max((1 - a ** 2) * (1 - c ** 2) / (1 - b ** 2), 1e-20 * dt) * lam ** 2
    var = g ** 2 * var + sd2
  return float(np.sqrt(var))


@pytest.mark.parametrize("method,tol", [("sde", 0.03), ("posterior", 0.06)])
def test_reverse_chain_returns_the_spread_of_a_gaussian_posterior(method, tol):
  """Known x0 = mu + s z (s = 0.1): with the exact noise prediction the reverse chain must end at spread s, and a
  score off by x0.8 / x1.2 must not (the true-noise test above cannot see such a scale error). At the official
  T = 100 the chains' exact spreads are 1.021 s (Euler-Maruyama) and 0.953 s (posterior: the x0 estimate's own
  uncertainty is dropped at every step); both reach s as T grows (1.002 / 0.995 at T = 1000, checked here)."""
  sched = daclip.irsde_schedule(T=100, lambda_=50.0 / 255.0, eps=0.005)
  s, n = 0.1, 20000
  mu = jnp.full((n, 1), 0.5)

  def oracle(params, x_t, mu_, t):
    b = jnp.exp(-sched.thetas_cumsum[t] * sched.dt)[:, None]
    v = sched.sigma_bars[t][:, None] ** 2
    return params * jnp.sqrt(v) * (x_t - mu_) / (b ** 2 * s ** 2 + v)    # params: the score-scale error

  run = jax.jit(lambda k, scale: daclip.reverse_sample(k, scale, mu, noise_fn=oracle, schedule=sched, method=method))
  exact = _gaussian_chain_std(sched, s, method)
  assert abs(exact / s - 1) < tol
  assert abs(_gaussian_chain_std(daclip.irsde_schedule(T=1000, lambda_=50.0 / 255.0, eps=0.005), s, method) / s
             - 1) < 0.01
  out = np.asarray(run(jax.random.key(0), 1.0))
  np.testing.assert_allclose(out.std(), exact, rtol=0.02)              # the chain is the official math (SE 0.5%)
  assert abs(out.mean() - 0.5) < 3 * s / np.sqrt(n) * 3
  assert abs(out.std() / s - 1) < tol                                  # spread s
  for scale in (0.8, 1.2):
    wrong = np.asarray(run(jax.random.key(0), scale)).std()
    np.testing.assert_allclose(wrong, _gaussian_chain_std(sched, s, method, scale), rtol=0.02)
    assert abs(wrong / s - 1) > 2 * tol, (scale, wrong / s)            # a scale error fails the spread check


def test_mean_of_posterior_chains_keeps_a_quarter_of_the_posterior_variance():
  """x0 = mu + s z with the exact noise prediction: one posterior chain ends at spread `exact` (~0.953 s, the
  numpy recursion above) around mu; the mean of K = 4 independent chains must spread exact / 2 (its variance is
  1 / K of one chain's), and it must equal the mean of the K chains run one by one with keys fold_in(key, k)."""
  from iclr24_jax.papers.daclip import irsde
  sched = daclip.irsde_schedule(T=100, lambda_=50.0 / 255.0, eps=0.005)
  s, n, k = 0.1, 20000, 4
  mu = jnp.full((n, 1), 0.5)

  def oracle(params, x_t, mu_, t):
    b = jnp.exp(-sched.thetas_cumsum[t] * sched.dt)[:, None]
    v = sched.sigma_bars[t][:, None] ** 2
    return jnp.sqrt(v) * (x_t - mu_) / (b ** 2 * s ** 2 + v)

  key = jax.random.key(0)
  mean = np.asarray(jax.jit(lambda kk: daclip.reverse_sample_mean(kk, None, mu, noise_fn=oracle, schedule=sched,
                                                                  num_samples=k))(key))
  one = jax.jit(lambda kk: daclip.reverse_sample(kk, None, mu, noise_fn=oracle, schedule=sched))
  chains = [np.asarray(one(jax.random.fold_in(key, i))) for i in range(k)]
  np.testing.assert_allclose(mean, np.mean(chains, axis=0), rtol=1e-5, atol=1e-6)
  exact = _gaussian_chain_std(sched, s, "posterior")
  np.testing.assert_allclose(np.std(chains[0]), exact, rtol=0.02)           # one chain: SE of a std 0.5%
  np.testing.assert_allclose(mean.std(), exact / np.sqrt(k), rtol=0.02)     # K chains: exact / 2
  with pytest.raises(ValueError, match="num_samples"):
    irsde.reverse_sample_mean(key, None, mu, noise_fn=oracle, schedule=sched, num_samples=0)
