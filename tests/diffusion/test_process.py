"""Forward process, posterior and eps / x0 / v conversions against closed forms."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.diffusion import process, schedules


def test_forward_process_empirical_moments():
  # x_t = sqrt(abar) x0 + sqrt(1 - abar) eps: mean sqrt(abar) x0, variance 1 - abar (DDPM Eq. 4).
  x0 = jnp.array([[2.0, -1.0, 0.5]])
  n = 200_000
  abar = 0.36  # sqrt = 0.6, 1 - abar = 0.64
  noise = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)
  xt = process.q_sample(jnp.broadcast_to(x0, (n, 3)), abar, noise)
  mean, var = process.q_mean_var(x0, abar)
  np.testing.assert_allclose(mean, [[1.2, -0.6, 0.3]], rtol=1e-6)
  np.testing.assert_allclose(var, 0.64, rtol=1e-6)
  # Standard errors: mean sqrt(0.64 / n) = 1.8e-3; variance 0.64 sqrt(2 / n) = 2.0e-3; allow 5 SE.
  np.testing.assert_allclose(xt.mean(0), mean[0], atol=5 * np.sqrt(0.64 / n))
  np.testing.assert_allclose(xt.var(0), 0.64, atol=5 * 0.64 * np.sqrt(2 / n))


def test_forward_steps_compose_to_marginal():
  # q(x_t | x_s) after q(x_s | x_0) is q(x_t | x_0): sqrt(abar_t / abar_s) sqrt(abar_s) = sqrt(abar_t), and
  # (abar_t / abar_s)(1 - abar_s) + 1 - abar_t / abar_s = 1 - abar_t.
  s = schedules.linear_beta_schedule(1000)
  t_s, t_t = 100, 400
  a_s, a_t = s.alpha_bar(t_s), s.alpha_bar(t_t)
  n = 200_000
  rng = np.random.default_rng(1)
  x0 = jnp.full((n, 1), 1.5)
  xs = process.q_sample(x0, a_s, rng.standard_normal((n, 1)).astype(np.float32))
  xt = process.q_sample_step(xs, a_s, a_t, rng.standard_normal((n, 1)).astype(np.float32))
  np.testing.assert_allclose(xt.mean(), 1.5 * np.sqrt(a_t), atol=5 * np.sqrt((1 - a_t) / n))
  np.testing.assert_allclose(xt.var(), 1 - a_t, atol=5 * (1 - a_t) * np.sqrt(2 / n))
  # One DDPM step t-1 -> t is N(sqrt(1 - beta_t) x, beta_t) (DDPM Eq. 2).
  x = jnp.ones((4, 2))
  z = np.random.default_rng(2).standard_normal((4, 2)).astype(np.float32)
  np.testing.assert_allclose(process.q_sample_step(x, s.alpha_bar(9), s.alpha_bar(10), z),
                             np.sqrt(1 - s.betas[10]) * x + np.sqrt(s.betas[10]) * z, rtol=1e-5, atol=1e-6)


def test_posterior_matches_ddpm_eq7():
  s = schedules.linear_beta_schedule(1000)
  t = 300
  beta, alpha, abar, abar_prev = s.betas[t], s.alphas[t], s.alpha_bars[t], s.alpha_bars[t - 1]
  rng = np.random.default_rng(3)
  x0 = rng.standard_normal((5, 4)).astype(np.float32)
  xt = rng.standard_normal((5, 4)).astype(np.float32)
  mean, var = process.posterior_mean_var(xt, x0, abar, abar_prev)
  # DDPM Eq. (7): mu = sqrt(abar_{t-1}) beta_t / (1 - abar_t) x0 + sqrt(alpha_t) (1 - abar_{t-1}) / (1 - abar_t) x_t,
  # beta-tilde = (1 - abar_{t-1}) / (1 - abar_t) beta_t.
  mu = (np.sqrt(abar_prev) * beta / (1 - abar) * x0 + np.sqrt(alpha) * (1 - abar_prev) / (1 - abar) * xt)
  np.testing.assert_allclose(mean, mu, rtol=1e-5, atol=1e-6)
  # The function recomputes beta_t = 1 - abar_t / abar_{t-1} from the float32 alpha_bars (cancellation ~1e-5).
  np.testing.assert_allclose(var, (1 - abar_prev) / (1 - abar) * beta, rtol=1e-4)


def test_posterior_matches_gaussian_conditioning_and_monte_carlo():
  # Independent derivation: for fixed x0, (x_s, x_t) is jointly Gaussian with
  # x_s = a_s x0 + sig_s e1, x_t = a_ts x_s + sig_ts e2 -> Cov(x_s, x_t) = a_ts sig_s^2, Var(x_t) = 1 - abar_t,
  # E[x_s | x_t] = a_s x0 + a_ts sig_s^2 / (1 - abar_t) (x_t - sqrt(abar_t) x0),
  # Var[x_s | x_t] = sig_s^2 - a_ts^2 sig_s^4 / (1 - abar_t).
  abar_s, abar_t = 0.8, 0.3
  a_s, a_ts, sig2_s = np.sqrt(abar_s), np.sqrt(abar_t / abar_s), 1 - abar_s
  x0 = 0.7
  xt = jnp.array([[-1.0], [0.2], [1.3]])
  mean, var = process.posterior_mean_var(xt, jnp.full_like(xt, x0), abar_t, abar_s)
  expect_mean = a_s * x0 + a_ts * sig2_s / (1 - abar_t) * (np.asarray(xt) - np.sqrt(abar_t) * x0)
  expect_var = sig2_s - a_ts ** 2 * sig2_s ** 2 / (1 - abar_t)
  np.testing.assert_allclose(mean, expect_mean, rtol=1e-5)
  np.testing.assert_allclose(var, expect_var, rtol=1e-5)
  # Monte Carlo: regress simulated x_s on x_t; slope = a_ts sig_s^2 / (1 - abar_t), residual var = expect_var.
  n = 400_000
  rng = np.random.default_rng(4)
  xs = (a_s * x0 + np.sqrt(sig2_s) * rng.standard_normal(n)).astype(np.float32)
  xt_mc = process.q_sample_step(xs[:, None], abar_s, abar_t, rng.standard_normal((n, 1)).astype(np.float32))[:, 0]
  xs, xt_mc = np.asarray(xs, np.float64), np.asarray(xt_mc, np.float64)
  slope = np.cov(xs, xt_mc)[0, 1] / xt_mc.var()
  resid = xs - xs.mean() - slope * (xt_mc - xt_mc.mean())
  np.testing.assert_allclose(slope, a_ts * sig2_s / (1 - abar_t), rtol=2e-2)
  np.testing.assert_allclose(resid.var(), expect_var, rtol=2e-2)


def test_posterior_to_clean_data_is_x0():
  mean, var = process.posterior_mean_var(jnp.ones((2, 3)), jnp.full((2, 3), 0.25), 0.5, 1.0)
  np.testing.assert_allclose(mean, 0.25, rtol=1e-6)
  np.testing.assert_allclose(var, 0.0, atol=0)


@pytest.mark.parametrize("shape", [(6, 3), (4, 5, 5, 2)])
def test_prediction_conversions_roundtrip(shape):
  rng = np.random.default_rng(5)
  x0 = rng.standard_normal(shape).astype(np.float32)
  eps = rng.standard_normal(shape).astype(np.float32)
  abar = rng.uniform(0.05, 0.95, shape[0]).astype(np.float32)  # one level per example

  @jax.jit
  def all_conversions(x0, eps, abar):
    xt = process.q_sample(x0, abar, eps)
    v = process.to_v(x0, eps, abar)
    return v, {name: (process.predict_x0(xt, out, abar, name), process.predict_eps(xt, out, abar, name),
                      process.convert(xt, out, abar, name, "v")) for name, out in (("eps", eps), ("x0", x0), ("v", v))}

  v, conv = all_conversions(x0, eps, abar)
  for name, (x0_hat, eps_hat, v_hat) in conv.items():
    np.testing.assert_allclose(x0_hat, x0, rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(eps_hat, eps, rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(v_hat, v, rtol=1e-4, atol=1e-5, err_msg=name)
  # v at abar = 0.25: alpha = 0.5, sigma = sqrt(0.75) = 0.8660254; v = 0.5 * 1 - 0.8660254 * 2 = -1.2320508.
  np.testing.assert_allclose(process.to_v(jnp.array([[2.0]]), jnp.array([[1.0]]), 0.25), [[-1.2320508]], rtol=1e-6)
  # score = -eps / sigma: eps = 0.6, abar = 0.64 -> sigma = 0.6 -> score = -1.
  np.testing.assert_allclose(process.eps_to_score(jnp.array([[0.6]]), 0.64), [[-1.0]], rtol=1e-6)
  np.testing.assert_allclose(process.score_to_eps(jnp.array([[-1.0]]), 0.64), [[0.6]], rtol=1e-6)


def test_gaussian_log_prob():
  g = process.Gaussian(jnp.zeros((2, 3)), jnp.full((2, 1), 4.0))
  # log N(x; 0, 4 I_3) at x = (2, 0, 0): -1.5 log(2 pi 4) - 4 / 8 = -4.8264 - 0.5 = -5.3264.
  x = jnp.array([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
  np.testing.assert_allclose(g.log_prob(x), [-1.5 * np.log(8 * np.pi) - 0.5, -1.5 * np.log(8 * np.pi)], rtol=1e-6)
  chex.assert_shape(g.sample(jax.random.key(0)), (2, 3))


def test_process_errors():
  with pytest.raises(ValueError, match="noise shape"):
    process.q_sample(jnp.zeros((2, 3)), 0.5, jnp.zeros((2, 4)))
  with pytest.raises(ValueError, match="per-example"):
    process.q_sample(jnp.zeros((2, 3)), jnp.ones(3) * 0.5, jnp.zeros((2, 3)))
  with pytest.raises(ValueError, match="prediction type"):
    process.predict_x0(jnp.zeros((2, 3)), jnp.zeros((2, 3)), 0.5, "score")
