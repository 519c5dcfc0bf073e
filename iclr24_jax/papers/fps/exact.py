"""Ground truths for the exactness study: exact posteriors and the filter FPS converges to.

- `gmm_posterior`: p(x_0 | y) for a Gaussian-mixture prior and y = A x_0 + sigma n (a mixture, closed form; the
  diffusion core's `GaussianMixture.condition_linear`).
- `gaussian_posterior`: the same for a Gaussian prior (the Kalman update).
- `kalman_reference`: for a Gaussian prior the diffusion model's exact denoiser is affine, the sampler's kernel is
  linear-Gaussian and FPS's hidden Markov model is solved exactly by a Kalman filter. Given one measurement
  sequence {y_t}, it returns the filtering distribution p_HMM(x_0 | y_{0:T}) that the particle filter approaches
  as M -> infinity (float64 numpy). Averaged over {y_t} it is what FPS samples with infinitely many particles,
  so comparing it with `gaussian_posterior` isolates FPS's modelling error from Monte Carlo error.
- `moments_over_sequences`: that average (law of total variance) from several sequences.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from iclr24_jax.diffusion.gmm import GaussianMixture
from iclr24_jax.papers.fps.operators import LinearOperator


def gmm_posterior(prior: GaussianMixture, operator: LinearOperator, y, sigma: float) -> GaussianMixture:
  """The exact p(x_0 | y) of a GMM prior [D] under y = A x_0 + sigma n (a GMM with K components).

  Args:
    prior: GaussianMixture over x [D] (operator.x_shape must be (D,) or flatten to D).
    operator: A (its dense matrix is used; small problems only).
    y: [*y_shape].
    sigma: noise std (> 0).
  """
  a = operator.matrix()
  return prior.condition_linear(a, jnp.asarray(y, jnp.float32).reshape(-1), sigma)


def gaussian_posterior(mean, cov, a, y, sigma: float) -> tuple[np.ndarray, np.ndarray]:
  """N(mean, cov) prior, y = A x + sigma n -> posterior (mean [D], cov [D, D]) in float64."""
  mean, cov, a, y = (np.asarray(v, np.float64) for v in (mean, cov, a, y))
  s = a @ cov @ a.T + sigma ** 2 * np.eye(a.shape[0])
  k = np.linalg.solve(s, a @ cov).T
  post_mean = mean + k @ (y.reshape(-1) - a @ mean)
  post_cov = cov - k @ a @ cov
  return post_mean, 0.5 * (post_cov + post_cov.T)


def _kernel_affine(mean0, cov0, a_t, a_s, sampler, c):
  """The sampler's kernel with the exact Gaussian denoiser: x_s ~ N(F x_t + f, v I) (float64)."""
  d = mean0.shape[0]
  eye = np.eye(d)
  ct = a_t * cov0 + (1 - a_t) * eye
  # x0_hat = mean0 + sqrt(a_t) cov0 ct^{-1} (x_t - sqrt(a_t) mean0) = G x_t + g
  g_mat = np.sqrt(a_t) * cov0 @ np.linalg.inv(ct)
  g_vec = mean0 - np.sqrt(a_t) * g_mat @ mean0
  if sampler == "ddpm":
    beta = 1 - a_t / a_s
    c1 = np.sqrt(a_s) * beta / (1 - a_t)
    c2 = np.sqrt(a_t / a_s) * (1 - a_s) / (1 - a_t)
    f_mat, f_vec, var = c1 * g_mat + c2 * eye, c1 * g_vec, (1 - a_s) / (1 - a_t) * beta
  elif sampler == "ddim":
    ce = np.sqrt(max((1 - c) * (1 - a_s), 0.0)) / np.sqrt(1 - a_t)   # eps = (x_t - sqrt(a_t) x0) / sqrt(1 - a_t)
    f_mat = np.sqrt(a_s) * g_mat + ce * (eye - np.sqrt(a_t) * g_mat)
    f_vec = np.sqrt(a_s) * g_vec - ce * np.sqrt(a_t) * g_vec
    var = c * (1 - a_s)
  else:
    raise ValueError(f"unknown sampler '{sampler}'.")
  return f_mat, f_vec, var


def _update(m, p, a, y, r):
  """Kalman update of N(m [S, D], p [D, D]) with y [S, k] ~ N(A x, r I); the covariance is shared by all S."""
  s = a @ p @ a.T + r * np.eye(a.shape[0])
  k = np.linalg.solve(s, a @ p).T
  return m + (y - m @ a.T) @ k.T, p - k @ a @ p


def kalman_reference(mean0, cov0, a, sigma: float, y_start, ys, alpha_bar_t, alpha_bar_s, *,
                     sampler: str = "ddpm", c: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
  """The M -> infinity limit of FPS's particle filter for a Gaussian prior N(mean0, cov0), per sequence.

  x_T ~ N(0, I) updated with y_T (likelihood variance abar_T sigma^2); each step predicts through the sampler's
  linear kernel and updates with y_s (variance abar_s sigma^2). Returns p_HMM(x_0 | y_{0:T}) = N(mean, cov).
  The covariance does not depend on the y's, so S sequences are filtered at once.

  Args:
    mean0: [D], cov0: [D, D] the data distribution (the denoiser is its exact one).
    a: [k, D] the operator's dense matrix.
    sigma: measurement noise std.
    y_start: [k] or [S, k]; ys: [N, k] or [S, N, k] the measurement sequence(s) (flattened y's).
    alpha_bar_t, alpha_bar_s: [N] the grid.
    sampler, c: as in `smc.sample`.

  Returns:
    (mean [D] or [S, D], cov [D, D]) float64.
  """
  mean0, cov0, a = (np.asarray(v, np.float64) for v in (mean0, cov0, a))
  a_t_all = np.asarray(alpha_bar_t, np.float64)
  a_s_all = np.asarray(alpha_bar_s, np.float64)
  n, k = len(a_t_all), a.shape[0]
  y_start = np.asarray(y_start, np.float64)
  single = y_start.size == k
  y_start = y_start.reshape(-1, k)
  ys = np.asarray(ys, np.float64).reshape(y_start.shape[0], n, k)
  d = mean0.shape[0]
  m, p = _update(np.zeros((y_start.shape[0], d)), np.eye(d), a, y_start, a_t_all[0] * sigma ** 2)
  for i in range(n):
    f_mat, f_vec, var = _kernel_affine(mean0, cov0, a_t_all[i], a_s_all[i], sampler, c)
    m = m @ f_mat.T + f_vec
    p = f_mat @ p @ f_mat.T + var * np.eye(d)
    m, p = _update(m, p, a, ys[:, i], a_s_all[i] * sigma ** 2)
  return (m[0] if single else m), 0.5 * (p + p.T)


def moments_over_sequences(means, cov) -> tuple[np.ndarray, np.ndarray]:
  """Mean and covariance of the equal-weight mixture of N(means[k] [S, D], cov [D, D] or [S, D, D])."""
  means, cov = np.asarray(means, np.float64), np.asarray(cov, np.float64)
  mu = means.mean(0)
  dev = means - mu
  return mu, (cov if cov.ndim == 2 else cov.mean(0)) + dev.T @ dev / len(means)
