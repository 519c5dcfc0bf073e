"""The Gaussian-mixture maths (`diffusion/gmm.py`): the score against autodiff and Tweedie, one
component's posterior as Gaussian conditioning, linear conditioning against Bayes, the denoiser's
predictions agree."""
import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import multivariate_normal

from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import process


def test_gmm_score_matches_autodiff_and_tweedie(ring, gmm8):
  @jax.jit
  def score_and_autodiff(g, x, abar):
    return g.score(x, abar), jax.vmap(jax.grad(lambda xi, ai: g.log_prob(xi[None], ai)[0]))(x, abar)

  for g in (ring, gmm8):
    x = 2 * np.random.default_rng(0).standard_normal((16, g.dim)).astype(np.float32)
    abar = jnp.linspace(0.05, 0.95, 16)  # a different noise level per example
    score, auto = score_and_autodiff(g, x, abar)
    np.testing.assert_allclose(score, auto, rtol=1e-4, atol=1e-4)
    # Tweedie: E[x0 | x_t] = (x_t + (1 - abar) score) / sqrt(abar).
    tweedie = (x + (1 - abar)[:, None] * score) / jnp.sqrt(abar)[:, None]
    np.testing.assert_allclose(g.x0_mean(x, abar), tweedie, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g.eps(x, abar), -jnp.sqrt(1 - abar)[:, None] * score, rtol=1e-5, atol=1e-6)


def test_gmm_posterior_single_component_is_gaussian_conditioning():
  # K = 1: p(x0 | x_t) = N(m, S), S = (Sigma^-1 + abar / (1 - abar) I)^-1,
  # m = S (Sigma^-1 mu + sqrt(abar) x_t / (1 - abar)).
  g = gmm_lib.make_gmm(jax.random.key(1), 3, 1, std=0.8)
  x = jnp.array([[0.3, -1.0, 2.0]])
  abar = 0.4
  post = g.posterior_x0(x, abar)
  sig_inv = np.linalg.inv(np.asarray(g.covs[0], np.float64))
  s = np.linalg.inv(sig_inv + abar / (1 - abar) * np.eye(3))
  m = s @ (sig_inv @ np.asarray(g.means[0]) + np.sqrt(abar) * np.asarray(x[0]) / (1 - abar))
  np.testing.assert_allclose(post.covs[0, 0], s, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(post.means[0, 0], m, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(post.weights, [[1.0]], rtol=1e-6)


def test_gmm_condition_linear_matches_bayes(gmm8):
  a = jnp.asarray(np.random.default_rng(2).standard_normal((3, 8)), jnp.float32)
  y = jnp.array([0.5, -1.0, 2.0])
  post = gmm8.condition_linear(a, y, 0.3)
  a64, y64 = np.asarray(a, np.float64), np.asarray(y, np.float64)
  logw = []
  for k in range(gmm8.num_components):
    cov, mu = np.asarray(gmm8.covs[k], np.float64), np.asarray(gmm8.means[k], np.float64)
    logw.append(np.log(float(gmm8.weights[k])) + multivariate_normal(a64 @ mu, a64 @ cov @ a64.T + 0.09 * np.eye(3))
                .logpdf(y64))
    s = np.linalg.inv(np.linalg.inv(cov) + a64.T @ a64 / 0.09)
    np.testing.assert_allclose(post.covs[k], s, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(post.means[k], s @ (np.linalg.solve(cov, mu) + a64.T @ y64 / 0.09), rtol=1e-3,
                               atol=1e-4)
  w = np.exp(np.array(logw) - np.max(logw))
  np.testing.assert_allclose(post.weights, w / w.sum(), rtol=1e-3, atol=1e-6)


def test_gmm_denoiser_predictions_agree(ring, lin):
  x = 2 * np.random.default_rng(3).standard_normal((10, 2)).astype(np.float32)
  t = jnp.arange(0, 1000, 100)
  abar = lin.alpha_bar(t)
  eps = gmm_lib.gmm_denoiser(ring, lin, "eps")(x, t)
  x0 = gmm_lib.gmm_denoiser(ring, lin, "x0")(x, t)
  np.testing.assert_allclose(x0, ring.x0_mean(x, abar), rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(process.eps_to_x0(x, eps, abar), x0, rtol=1e-4, atol=1e-4)
