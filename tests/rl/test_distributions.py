"""Action distributions (`rl/distributions.py`) against closed forms: categorical, Gaussian, tanh-Gaussian."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.rl import distributions


def test_categorical_closed_forms():
  logits = jnp.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
  p = np.exp(np.asarray(logits)) / np.exp(np.asarray(logits)).sum(-1, keepdims=True)
  d = distributions.Categorical(logits)
  np.testing.assert_allclose(d.log_prob(jnp.array([2, 1])), np.log([p[0, 2], p[1, 1]]), rtol=1e-6)
  np.testing.assert_allclose(d.entropy(), -(p * np.log(p)).sum(-1), rtol=1e-5)
  np.testing.assert_allclose(d.entropy()[1], math.log(3.0), rtol=1e-6)  # uniform over 3
  sample = d.sample(jax.random.key(0))
  chex.assert_shape(sample, (2,))
  chex.assert_type(sample, jnp.int32)


def test_gaussian_closed_forms():
  mean, log_std = jnp.array([[0.3, -1.0]]), jnp.array([[0.2, -0.5]])
  x = jnp.array([[0.0, -0.4]])
  s = np.exp(np.asarray(log_std))
  ref = np.sum(-0.5 * ((np.asarray(x) - np.asarray(mean)) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi))
  for d in (distributions.Gaussian(mean, log_std), distributions.ClippedGaussian(mean, log_std)):
    np.testing.assert_allclose(d.log_prob(x)[0], ref, rtol=1e-6)
    np.testing.assert_allclose(d.entropy()[0], np.sum(0.5 * np.log(2 * np.pi * np.e * s ** 2)), rtol=1e-6)
  clipped = distributions.ClippedGaussian(mean, log_std)
  assert float(jnp.max(jnp.abs(clipped.to_env(jnp.array([[3.0, -7.0]]))))) == 1.0


def test_tanh_gaussian_log_prob_change_of_variables():
  # p(a) = N(atanh a; mu, s) / (1 - a^2) per dimension.
  mean, log_std = jnp.array([0.2, -0.7]), jnp.array([-0.3, 0.1])
  d = distributions.TanhGaussian(mean, log_std)
  a = jnp.array([0.5, -0.9])
  u = np.arctanh(np.asarray(a, np.float64))
  s = np.exp(np.asarray(log_std, np.float64))
  ref = np.sum(-0.5 * ((u - np.asarray(mean)) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi) - np.log(1 - np.asarray(a, np.float64) ** 2))
  np.testing.assert_allclose(d.log_prob_action(a), ref, rtol=1e-5)
  np.testing.assert_allclose(d.log_prob(jnp.arctanh(a)), ref, rtol=1e-5)


def test_tanh_gaussian_entropy_estimate_matches_quadrature():
  # H[tanh(u)] = H[N(mu, s)] + E_u[log(1 - tanh(u)^2)]; E by 200-point Gauss-Hermite quadrature (1-D), with
  # log(1 - tanh(u)^2) = -2 log cosh u = -2 (|u| + log1p(exp(-2|u|)) - log 2) (stable for large |u|).
  mu, ls = 0.4, -0.2
  s = math.exp(ls)
  x, w = np.polynomial.hermite_e.hermegauss(200)
  u = mu + s * x
  log_jac = -2.0 * (np.abs(u) + np.log1p(np.exp(-2.0 * np.abs(u))) - math.log(2.0))
  exact = 0.5 * math.log(2 * math.pi * math.e * s * s) + np.sum(w * log_jac) / math.sqrt(2 * math.pi)
  d = distributions.TanhGaussian(jnp.full((100_000, 1), mu), jnp.full((100_000, 1), ls))
  est = np.asarray(d.entropy(jax.random.key(0)), np.float64)
  se = est.std() / math.sqrt(est.size)
  assert abs(est.mean() - exact) < 5 * se, (est.mean(), exact, se)


def test_make_gaussian_bad_squash():
  with pytest.raises(ValueError, match="squash"):
    distributions.make_gaussian(jnp.zeros(2), jnp.zeros(2), squash="sigmoid")
