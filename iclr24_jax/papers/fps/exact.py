"""Ground truths for the exactness study: exact posteriors and the filter FPS converges to.

- `gmm_posterior`: p(x_0 | y) for a Gaussian-mixture prior and y = A x_0 + sigma n (a mixture, closed form; the
  diffusion core's `GaussianMixture.condition_linear`).
- `gaussian_posterior`: the same for a Gaussian prior (the Kalman update).
- `kalman_reference`: for a Gaussian prior the diffusion model's exact denoiser is affine, the sampler's kernel is
  linear-Gaussian and FPS's hidden Markov model is solved exactly by a Kalman filter. Given one measurement
  sequence {y_t}, it returns the filtering distribution p_HMM(x_0 | y_{0:T}) that the particle filter approaches
  as M -> infinity (float64 numpy). Averaged over {y_t} it is what FPS samples with infinitely many particles,
  so comparing it with `gaussian_posterior` isolates FPS's modelling error from Monte Carlo error.
- `noise_tracking_kalman`: the exact posterior from the same sequences. All y_t = A x_t + sqrt(abar_t) sigma n share
  ONE noise draw n, so this Kalman filter carries n in its state (x_t, n) and observes y_t WITHOUT extra noise;
  with the exact reverse kernel it returns p(x_0 | y) itself for any sequence ending at y (the
  y_t for t > 0 only add A eps_t, which is independent of (x_0, n)). FPS's HMM (`kalman_reference`) instead treats the y_t noises as
  independent, which is why FPS is over-confident.
- `chain_moments` / `telescoping_reference`: the sampler's output law N(m, P) with the exact denoiser, and the
  M -> infinity limit of `smc.particle_filter(weights='telescoping')`: the exact posterior with N(m, P) as prior.
- `moments_over_sequences`: that average (law of total variance) from several sequences.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from iclr24_jax.diffusion.gmm import GaussianMixture
from iclr24_jax.papers.fps.operators import LinearOperator

KERNELS = ("exact", "ddpm", "ddim")   # the exact reverse kernel of the forward process, or a sampler's


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
  """N(mean, cov) prior, y = A x + sigma n -> posterior (mean [D], cov [D, D]) in float64.

  Args:
    mean: [D] prior mean.
    cov: [D, D] prior covariance.
    a: [k, D] measurement matrix A.
    y: [k] measurement (any shape with k entries; flattened).
    sigma: measurement noise std (> 0, or A cov A^T must be invertible).

  Returns:
    (posterior mean [D], symmetrised posterior covariance [D, D]), float64 numpy.
  """
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
    sampler, c: as in `smc.sample`; 'exact' = the exact reverse kernel from q(x_T) (FPS's emission model on the
      true chain: compare with `noise_tracking_kalman`, which differs only in the emissions).

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
  if sampler not in KERNELS:
    raise ValueError(f"unknown sampler '{sampler}'; choose one of {KERNELS}.")
  if sampler == "exact":    # the exact reverse chain from q(x_T): isolates the emission model
    a_T = a_t_all[0]
    m0, p0 = np.sqrt(a_T) * np.broadcast_to(mean0, (y_start.shape[0], d)), a_T * cov0 + (1 - a_T) * np.eye(d)
  else:                     # FPS's start x_T ~ N(0, I)
    m0, p0 = np.zeros((y_start.shape[0], d)), np.eye(d)
  m, p = _update(m0, p0, a, y_start, a_t_all[0] * sigma ** 2)
  for i in range(n):
    if sampler == "exact":
      f_mat, f_vec, q = _exact_reverse(mean0, cov0, a_t_all[i], a_s_all[i])
    else:
      f_mat, f_vec, var = _kernel_affine(mean0, cov0, a_t_all[i], a_s_all[i], sampler, c)
      q = var * np.eye(d)
    m = m @ f_mat.T + f_vec
    p = f_mat @ p @ f_mat.T + q
    m, p = _update(m, p, a, ys[:, i], a_s_all[i] * sigma ** 2)
  return (m[0] if single else m), 0.5 * (p + p.T)


def _exact_reverse(mean0, cov0, a_t, a_s):
  """The exact reverse kernel p(x_s | x_t) = N(F x_t + f, Q) of the forward process for data N(mean0, cov0).

  With C_u = abar_u cov0 + (1 - abar_u) I and Cov(x_t, x_s) = sqrt(abar_t / abar_s) C_s (x_t = sqrt(abar_t / abar_s)
  x_s + independent noise): F = sqrt(abar_t / abar_s) C_s C_t^{-1}, f = sqrt(abar_s) mean0 - F sqrt(abar_t) mean0,
  Q = C_s - (abar_t / abar_s) C_s C_t^{-1} C_s (full covariance, unlike a sampler's isotropic v I).
  """
  eye = np.eye(mean0.shape[0])
  c_t = a_t * cov0 + (1 - a_t) * eye
  c_s = a_s * cov0 + (1 - a_s) * eye
  f_mat = np.sqrt(a_t / a_s) * np.linalg.solve(c_t, c_s).T          # C_s C_t^{-1} (both symmetric)
  f_vec = np.sqrt(a_s) * mean0 - f_mat @ (np.sqrt(a_t) * mean0)
  q = c_s - np.sqrt(a_t / a_s) * f_mat @ c_s
  return f_mat, f_vec, 0.5 * (q + q.T)


def _check_sequences(a, y_start, ys, n):
  k = a.shape[0]
  y_start = np.asarray(y_start, np.float64)
  if y_start.size % k:
    raise ValueError(f"y_start has {y_start.size} values, not a multiple of the {k} measured coordinates.")
  y_start = y_start.reshape(-1, k)
  ys = np.asarray(ys, np.float64)
  if ys.size != y_start.shape[0] * n * k:
    raise ValueError(f"ys has shape {ys.shape}; expected [{n}, {k}] or [{y_start.shape[0]}, {n}, {k}] "
                     f"(one measurement per step of the grid).")
  if not (np.all(np.isfinite(y_start)) and np.all(np.isfinite(ys))):
    raise ValueError("the measurement sequence contains NaN/inf.")
  return y_start, ys.reshape(y_start.shape[0], n, k)


def noise_tracking_kalman(mean0, cov0, a, sigma: float, y_start, ys, alpha_bar_t, alpha_bar_s
                          ) -> tuple[np.ndarray, np.ndarray]:
  """p(x_0 | y_{0:T}) for a Gaussian prior when the y_t share one measurement noise n (float64 Kalman filter).

  The state is z_t = (x_t [D], n [k]) with n ~ N(0, I) a priori, independent of the chain; the observations are
  NOISE-FREE linear functions of it, y_t = A x_t + sqrt(abar_t) sigma n = H_t z_t, H_t = [A, sqrt(abar_t) sigma I]
  (x_t and y_t known => sqrt(abar_t) sigma n = y_t - A x_t known). Prediction moves x through the exact reverse
  kernel of the forward process (`_exact_reverse`) and keeps n; x_T starts from its exact marginal
  N(sqrt(abar_T) mean0, abar_T cov0 + (1 - abar_T) I). The joint law of (x_{0:T}, n, y_{0:T}) is then the true one,
  in which y_t - sqrt(abar_t) y = sqrt(1 - abar_t) A eps_t is independent of (x_0, n): the result equals the exact
  posterior p(x_0 | y) (`gaussian_posterior`) for ANY sequence ending at y = ys[-1] (the filter's mean is linear
  in the y's and almost surely equal to E[x_0 | y]; its covariance does not depend on them). FPS's hidden Markov
  model (`kalman_reference`) differs only in its emissions, N(y_t; A x_t, abar_t sigma^2 I) independent over t.

  Only the exact kernel is offered: with a sampler's approximate kernel the noise-free observations make the
  filter hypersensitive to the kernel's discretisation error (DDPM, 1000 steps: Var(A x) 0.12-0.96 of the exact
  posterior and the mean off by tens of posterior stds on c = 0.95 sequences), since every y_t then seems to
  carry information about n.

  Args:
    mean0: [D], cov0: [D, D] the data distribution.
    a: [k, D] the operator's dense matrix.
    sigma: measurement noise std (> 0).
    y_start: [k] or [S, k] the measurement at alpha_bar_t[0]; ys: [N, k] or [S, N, k] (ys[..., -1, :] = y).
    alpha_bar_t, alpha_bar_s: [N] the grid (alpha_bar_s[-1] = 1).

  Returns:
    (mean [D] or [S, D], cov [D, D]) of x_0 given the sequence, float64.
  """
  if not sigma > 0:
    raise ValueError(f"sigma must be > 0 (the shared noise n is scaled by it), got {sigma}.")
  mean0, cov0, a = (np.asarray(v, np.float64) for v in (mean0, cov0, a))
  if a.ndim != 2 or a.shape[1] != mean0.shape[0] or cov0.shape != (mean0.shape[0],) * 2:
    raise ValueError(f"need mean0 [D], cov0 [D, D], a [k, D]; got {mean0.shape}, {cov0.shape}, {a.shape}.")
  a_t_all = np.asarray(alpha_bar_t, np.float64)
  a_s_all = np.asarray(alpha_bar_s, np.float64)
  n_steps, (k, d) = len(a_t_all), a.shape
  single = np.asarray(y_start).size == k
  y_start, ys = _check_sequences(a, y_start, ys, n_steps)

  def update(m, p, y, a_bar):
    h = np.concatenate([a, np.sqrt(a_bar) * sigma * np.eye(k)], 1)     # [k, D + k]
    s = h @ p @ h.T                                                    # no observation noise
    gain = np.linalg.solve(s, h @ p).T                                 # [D + k, k]
    p = p - gain @ s @ gain.T
    return m + (y - m @ h.T) @ gain.T, 0.5 * (p + p.T)

  a_T = a_t_all[0]
  m = np.broadcast_to(np.concatenate([np.sqrt(a_T) * mean0, np.zeros(k)]), (y_start.shape[0], d + k)).copy()
  p = np.zeros((d + k, d + k))
  p[:d, :d], p[d:, d:] = a_T * cov0 + (1 - a_T) * np.eye(d), np.eye(k)
  m, p = update(m, p, y_start, a_T)
  for i in range(n_steps):
    f_mat, f_vec, q = _exact_reverse(mean0, cov0, a_t_all[i], a_s_all[i])
    g = np.eye(d + k)
    g[:d, :d] = f_mat
    m = m @ g.T
    m[:, :d] += f_vec
    p = g @ p @ g.T
    p[:d, :d] += q
    m, p = update(m, p, ys[:, i], a_s_all[i])
  cov = 0.5 * (p[:d, :d] + p[:d, :d].T)
  return (m[0, :d] if single else m[:, :d]), cov


def chain_moments(mean0, cov0, alpha_bar_t, alpha_bar_s, *, sampler: str = "ddpm", c: float = 0.95
                  ) -> tuple[np.ndarray, np.ndarray]:
  """The output law N(mean [D], cov [D, D]) of the sampler's chain from x_T ~ N(0, I) with the exact denoiser of
  N(mean0, cov0) (no measurement; float64). 'exact' starts from q(x_T) and uses the exact reverse kernel (returns
  the data law up to rounding).

  Args:
    mean0: [D] data mean.
    cov0: [D, D] data covariance.
    alpha_bar_t: [N] noise levels of the sampler's steps (decreasing noise order).
    alpha_bar_s: [N] the next level of each step (the last 1.0).
    sampler: 'ddpm', 'ddim' (the c-rate kernel) or 'exact'.
    c: the DDIM kernel's fresh-noise fraction (variance c (1 - abar_s)).

  Returns:
    (mean [D], symmetrised cov [D, D]) float64.

  Raises:
    ValueError: unknown sampler.
  """
  if sampler not in KERNELS:
    raise ValueError(f"unknown sampler '{sampler}'; choose one of {KERNELS}.")
  mean0, cov0 = np.asarray(mean0, np.float64), np.asarray(cov0, np.float64)
  d = mean0.shape[0]
  a_t_all = np.asarray(alpha_bar_t, np.float64)
  a_s_all = np.asarray(alpha_bar_s, np.float64)
  if sampler == "exact":
    m, p = np.sqrt(a_t_all[0]) * mean0, a_t_all[0] * cov0 + (1 - a_t_all[0]) * np.eye(d)
  else:
    m, p = np.zeros(d), np.eye(d)
  for a_t, a_s in zip(a_t_all, a_s_all):
    if sampler == "exact":
      f_mat, f_vec, q = _exact_reverse(mean0, cov0, a_t, a_s)
    else:
      f_mat, f_vec, var = _kernel_affine(mean0, cov0, a_t, a_s, sampler, c)
      q = var * np.eye(d)
    m, p = f_mat @ m + f_vec, f_mat @ p @ f_mat.T + q
  return m, 0.5 * (p + p.T)


def telescoping_reference(mean0, cov0, a, sigma: float, y, alpha_bar_t, alpha_bar_s, *, sampler: str = "ddpm",
                          c: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
  """The M -> infinity limit of `particle_filter(..., weights='telescoping')` for a Gaussian prior (float64).

  The telescoping weights make the last SMC target p_chain(x_0) N(y; A x_0, sigma^2 I) whatever the y sequence,
  so the limit is `gaussian_posterior` with the chain's output law (`chain_moments`) as the prior. For the DDPM
  kernel with fine steps the chain's law is the data law and this is the exact posterior.

  Args:
    mean0: [D], cov0: [D, D] the data law; a: [k, D]; sigma: noise std; y: [k] the final measurement.
    alpha_bar_t, alpha_bar_s: [N] the grid; sampler, c: the kernel ('ddpm' | 'ddim' | 'exact').

  Returns:
    (mean [D], cov [D, D]) float64.
  """
  m, p = chain_moments(mean0, cov0, alpha_bar_t, alpha_bar_s, sampler=sampler, c=c)
  return gaussian_posterior(m, p, a, y, sigma)


def moments_over_sequences(means, cov) -> tuple[np.ndarray, np.ndarray]:
  """Mean and covariance of the equal-weight mixture of N(means[k], cov) (`means` `[S, D]`, `cov` `[D, D]` or `[S, D, D]`).

  Args:
    means: [S, D] component means (one per measurement sequence).
    cov: shared [D, D] covariance, or [S, D, D] per component (averaged).

  Returns:
    (mean [D], cov [D, D]) float64: law-of-total-variance moments of the mixture.
  """
  means, cov = np.asarray(means, np.float64), np.asarray(cov, np.float64)
  mu = means.mean(0)
  dev = means - mu
  return mu, (cov if cov.ndim == 2 else cov.mean(0)) + dev.T @ dev / len(means)
