"""Gaussian-mixture data with its exact diffused score: a "perfect denoiser" for tests and exactness studies.

Data x_0 ~ sum_k w_k N(mu_k, Sigma_k). Under q(x_t | x_0) = N(alpha x_0, sigma^2 I) (alpha^2 = abar,
sigma^2 = 1 - abar) the marginal stays a mixture:
  q(x_t) = sum_k w_k N(alpha mu_k, C_k),   C_k = alpha^2 Sigma_k + sigma^2 I.
Its score and the optimal predictions follow in closed form (r_k = responsibility of component k at x_t):
  score(x_t) = -sum_k r_k C_k^{-1} (x_t - alpha mu_k)
  E[eps | x_t] = -sigma score(x_t)
  p(x_0 | x_t) = sum_k r_k N(m_k, S_k),   m_k = mu_k + alpha Sigma_k C_k^{-1} (x_t - alpha mu_k),
                                           S_k = Sigma_k - alpha^2 Sigma_k C_k^{-1} Sigma_k
With Sigma_k = U_k diag(l_k) U_k^T (eigendecomposition, done once), C_k^{-1} = U_k diag(1 / (abar l_k + 1 - abar))
U_k^T, so every noise level (even a different one per example) costs O(K D^2) per point without refactoring.
`condition_linear` gives the exact posterior of a linear-Gaussian inverse problem y = A x_0 + noise (a mixture
again), the ground truth for posterior samplers such as fps.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.diffusion import process
from iclr24_jax.diffusion.schedules import Schedule


@flax.struct.dataclass
class GaussianMixture:
  """A Gaussian mixture in D dimensions.

  Attributes:
    weights: [K] mixture weights (sum to 1).
    means: [K, D] component means.
    covs: [K, D, D] component covariances (symmetric positive definite).
  """

  weights: jax.Array
  means: jax.Array
  covs: jax.Array

  @property
  def num_components(self) -> int:
    return int(self.weights.shape[0])

  @property
  def dim(self) -> int:
    return int(self.means.shape[1])

  def mean(self) -> jax.Array:
    """[D] overall mean sum_k w_k mu_k."""
    return self.weights @ self.means

  def covariance(self) -> jax.Array:
    """[D, D] overall covariance sum_k w_k (Sigma_k + mu_k mu_k^T) - mu mu^T."""
    m = self.mean()
    second = jnp.einsum("k,kij->ij", self.weights, self.covs + jnp.einsum("ki,kj->kij", self.means, self.means))
    return second - jnp.outer(m, m)

  def sample(self, key: jax.Array, n: int, return_components: bool = False):
    """Draws n points [n, D] (and their component indices [n]).

    Args:
      key: PRNG key.
      n: number of points.
      return_components: also return each point's component.

    Returns:
      float32 [n, D], or ([n, D], int32 [n] components in [0, K)).
    """
    key_k, key_z = jax.random.split(key)
    comp = jax.random.categorical(key_k, jnp.log(self.weights), shape=(n,))
    chol = jnp.linalg.cholesky(self.covs)
    z = jax.random.normal(key_z, (n, self.dim))
    x = self.means[comp] + jnp.einsum("nij,nj->ni", chol[comp], z)
    return (x, comp) if return_components else x

  def diffused(self, alpha_bar) -> "GaussianMixture":
    """The marginal q(x_t) at noise level alpha_bar (a scalar): means alpha mu_k, covs abar Sigma_k + (1-abar) I."""
    a = jnp.asarray(alpha_bar, jnp.float32)
    eye = jnp.eye(self.dim)
    return GaussianMixture(self.weights, jnp.sqrt(a) * self.means, a * self.covs + (1.0 - a) * eye)

  def eig(self) -> tuple[jax.Array, jax.Array]:
    """Eigendecomposition of the covariances: eigenvalues [K, D], eigenvectors [K, D, D] (columns)."""
    return jnp.linalg.eigh(self.covs)

  def _terms(self, x, alpha_bar, eig=None):
    """Pieces at x [B, D], abar (scalar or [B]): (log w_k N(x; .) [B, K], C_k^{-1}(x - alpha mu_k) [B, K, D], abar)."""
    if x.ndim != 2 or x.shape[1] != self.dim:
      raise ValueError(f"GMM points must be [B, {self.dim}], got {x.shape}.")
    a = jnp.broadcast_to(jnp.asarray(alpha_bar, jnp.float32), (x.shape[0],))
    lam, u = self.eig() if eig is None else eig
    c_eig = a[:, None, None] * lam[None] + (1.0 - a)[:, None, None]        # [B, K, D] eigenvalues of C_k
    diff = x[:, None, :] - jnp.sqrt(a)[:, None, None] * self.means[None]    # [B, K, D]
    proj = jnp.einsum("kdj,bkd->bkj", u, diff)                              # U_k^T (x - alpha mu_k)
    maha = jnp.sum(proj ** 2 / c_eig, -1)                                   # [B, K]
    logdet = jnp.sum(jnp.log(c_eig), -1)
    log_comp = jnp.log(self.weights)[None] - 0.5 * (maha + logdet + self.dim * jnp.log(2 * jnp.pi))
    cinv_diff = jnp.einsum("kdj,bkj->bkd", u, proj / c_eig)                 # C_k^{-1} (x - alpha mu_k)
    return log_comp, cinv_diff, a

  def log_prob(self, x: jax.Array, alpha_bar=1.0) -> jax.Array:
    """log q(x_t) [B] of the diffused mixture (alpha_bar = 1: the data density).

    Args:
      x: [B, D] points.
      alpha_bar: scalar or [B] noise level.

    Returns:
      float32 [B].

    Raises:
      ValueError: x is not [B, D].
    """
    log_comp, _, _ = self._terms(x, alpha_bar)
    return jax.nn.logsumexp(log_comp, -1)

  def responsibilities(self, x: jax.Array, alpha_bar=1.0) -> jax.Array:
    """r_k(x_t) = P(component k | x_t) [B, K].

    Args:
      x: [B, D] points.
      alpha_bar: scalar or [B] noise level (1: the data mixture).

    Returns:
      float32 [B, K], rows summing to 1.
    """
    log_comp, _, _ = self._terms(x, alpha_bar)
    return jax.nn.softmax(log_comp, -1)

  def score(self, x: jax.Array, alpha_bar, eig=None) -> jax.Array:
    """grad_x log q(x_t) [B, D] = -sum_k r_k C_k^{-1} (x - alpha mu_k) (`eig`: a cached `self.eig()`).

    Args:
      x: [B, D] points.
      alpha_bar: scalar or [B] noise level.
      eig: optional (eigenvalues [K, D], eigenvectors [K, D, D]) from `self.eig()`.

    Returns:
      float32 [B, D].
    """
    log_comp, cinv_diff, _ = self._terms(x, alpha_bar, eig)
    r = jax.nn.softmax(log_comp, -1)
    return -jnp.einsum("bk,bkd->bd", r, cinv_diff)

  def eps(self, x: jax.Array, alpha_bar, eig=None) -> jax.Array:
    """The optimal eps prediction E[eps | x_t] = -sqrt(1 - abar) score [B, D].

    Args:
      x: [B, D] noisy points.
      alpha_bar: scalar or [B] noise level, in [0, 1).
      eig: optional cached `self.eig()`.

    Returns:
      float32 [B, D].
    """
    return process.score_to_eps(self.score(x, alpha_bar, eig), jnp.broadcast_to(alpha_bar, (x.shape[0],)))

  def posterior_x0(self, x: jax.Array, alpha_bar) -> "PosteriorMixture":
    """The exact p(x_0 | x_t): a mixture with weights r [B, K], means [B, K, D], covs [B, K, D, D].

    Args:
      x: [B, D] noisy points x_t.
      alpha_bar: scalar or [B] noise level.

    Returns:
      PosteriorMixture(weights [B, K], means [B, K, D], covs [B, K, D, D]).
    """
    log_comp, cinv_diff, a = self._terms(x, alpha_bar)
    r = jax.nn.softmax(log_comp, -1)
    alpha = jnp.sqrt(a)
    means = self.means[None] + alpha[:, None, None] * jnp.einsum("kij,bkj->bki", self.covs, cinv_diff)
    lam, u = self.eig()
    c_eig = a[:, None, None] * lam[None] + (1.0 - a)[:, None, None]
    # S_k = Sigma_k - abar Sigma_k C_k^{-1} Sigma_k = U diag(l - abar l^2 / c) U^T = U diag(l (1-abar) / c) U^T.
    s_eig = lam[None] * (1.0 - a)[:, None, None] / c_eig
    covs = jnp.einsum("kij,bkj,klj->bkil", u, s_eig, u)
    return PosteriorMixture(weights=r, means=means, covs=covs)

  def x0_mean(self, x: jax.Array, alpha_bar) -> jax.Array:
    """`E[x_0 | x_t]` `[B, D]` (Tweedie: (x_t + sigma^2 score) / alpha).

    Args:
      x: [B, D] noisy points x_t.
      alpha_bar: scalar or [B] noise level.

    Returns:
      float32 [B, D].
    """
    post = self.posterior_x0(x, alpha_bar)
    return jnp.einsum("bk,bkd->bd", post.weights, post.means)

  def condition_linear(self, A: jax.Array, y: jax.Array, noise_std: float) -> "GaussianMixture":
    """The exact posterior p(x_0 | y) for y = A x_0 + noise_std * z (a mixture again).

    Per component: S_k' = (Sigma_k^{-1} + A^T A / s^2)^{-1}, mu_k' = S_k' (Sigma_k^{-1} mu_k + A^T y / s^2),
    w_k' proportional to w_k N(y; A mu_k, A Sigma_k A^T + s^2 I).

    Args:
      A: [M, D] observation matrix.
      y: [M] the observation.
      noise_std: s > 0.

    Returns:
      GaussianMixture over x_0.
    """
    if A.ndim != 2 or A.shape[1] != self.dim or y.shape != (A.shape[0],):
      raise ValueError(f"condition_linear needs A [M, {self.dim}] and y [M], got {A.shape} and {y.shape}.")
    if not noise_std > 0:
      raise ValueError(f"noise_std must be > 0, got {noise_std}.")
    s2 = noise_std ** 2
    prec = jnp.linalg.inv(self.covs) + (A.T @ A / s2)[None]
    covs = jnp.linalg.inv(prec)
    covs = 0.5 * (covs + jnp.swapaxes(covs, 1, 2))
    rhs = jnp.linalg.solve(self.covs, self.means[..., None])[..., 0] + (A.T @ y / s2)[None]
    means = jnp.einsum("kij,kj->ki", covs, rhs)
    pred_cov = jnp.einsum("mi,kij,nj->kmn", A, self.covs, A) + s2 * jnp.eye(A.shape[0])[None]
    diff = y[None] - self.means @ A.T
    chol = jnp.linalg.cholesky(pred_cov)
    sol = jax.scipy.linalg.solve_triangular(chol, diff[..., None], lower=True)[..., 0]
    log_lik = -0.5 * jnp.sum(sol ** 2, -1) - jnp.sum(jnp.log(jnp.diagonal(chol, axis1=1, axis2=2)), -1)
    weights = jax.nn.softmax(jnp.log(self.weights) + log_lik)
    return GaussianMixture(weights, means, covs)


@flax.struct.dataclass
class PosteriorMixture:
  """p(x_0 | x_t) per example: weights [B, K], means [B, K, D], covs [B, K, D, D]."""

  weights: jax.Array
  means: jax.Array
  covs: jax.Array


def gmm_denoiser(gmm: GaussianMixture, schedule: Schedule, prediction: str = "eps"):
  """The exact (Bayes-optimal) denoiser of GMM data: denoiser(x_t [B, D], t [B]) -> prediction [B, D].

  Args:
    gmm: the data distribution.
    schedule: maps the sampler's times t to alpha_bar.
    prediction: 'eps' (E[eps | x_t]), 'x0' (E[x_0 | x_t]) or 'v' (E[v | x_t]).
  """
  if prediction not in process.PREDICTIONS:
    raise ValueError(f"unknown prediction type '{prediction}'; choose one of {process.PREDICTIONS}.")

  eig = gmm.eig()  # once, outside the sampler's loop

  def denoiser(x_t, t):
    a = schedule.alpha_bar(t)
    eps = gmm.eps(x_t, a, eig)
    return process.convert(x_t, eps, a, "eps", prediction)

  return denoiser


def make_gmm(key: jax.Array, dim: int, num_components: int, scale: float = 3.0, std: float = 0.3,
             weights=None) -> GaussianMixture:
  """A random mixture: means ~ scale * N(0, I) / sqrt(dim) * sqrt(2), random SPD covariances with std ~ `std`.

  Args:
    key: randomness.
    dim: D.
    num_components: K.
    scale: spread of the means.
    std: typical per-axis standard deviation of a component (eigenvalues in [0.5, 1.5] * std^2).
    weights: [K] non-negative with a positive sum (default: proportional to 1..K, so they are unequal).

  Returns:
    GaussianMixture (weights normalised; NaN under jit for negative traced weights, eager calls raise).
  """
  where = "diffusion.make_gmm"
  dim = checks.static_int(where, "dim", dim, low=1)
  num_components = checks.static_int(where, "num_components", num_components, low=1)
  checks.in_range(where, "std", std, 0.0, None, low_open=True)
  key_m, key_r, key_e = jax.random.split(key, 3)
  means = scale * jax.random.normal(key_m, (num_components, dim)) * np.sqrt(2.0 / dim)
  q, _ = jnp.linalg.qr(jax.random.normal(key_r, (num_components, dim, dim)))
  eig = std ** 2 * jax.random.uniform(key_e, (num_components, dim), minval=0.5, maxval=1.5)
  covs = jnp.einsum("kij,kj,klj->kil", q, eig, q)
  covs = 0.5 * (covs + jnp.swapaxes(covs, 1, 2))
  if weights is None:
    weights = np.arange(1, num_components + 1, dtype=np.float32)
  checks.shapes(where, weights=(weights, f"{num_components}"))
  xp = checks.xp(weights)
  w = xp.asarray(weights)
  ok = checks.require(where, xp.all(w >= 0) & (xp.sum(w) > 0), checks.ProbabilityError,
                      "weights must be >= 0 with a positive sum.")
  weights = jnp.asarray(weights, jnp.float32)
  return checks.poison(GaussianMixture(weights / jnp.sum(weights), means, covs), ok)


def ring_gmm(num_components: int = 6, radius: float = 3.0, std: float = 0.35, weights=None) -> GaussianMixture:
  """A 2-D mixture of K components on a circle, with anisotropic covariances and unequal weights.

  Neighbouring means are 2 r sin(pi / K) apart (3.0 for K = 6, r = 3), i.e. ~8.6 std: nearest-component
  assignment of a sample is then almost never wrong, so mixture weights can be read off samples.

  Args:
    num_components: K.
    radius: r, the circle's radius.
    std: base standard deviation (x 1.3 along the tangent, x 0.7 radially).
    weights: optional [K] positive weights (normalised); default proportional to 1, 2, ..., K.

  Returns:
    GaussianMixture with weights [K], means [K, 2], covs [K, 2, 2], all float32.
  """
  ang = 2 * np.pi * np.arange(num_components) / num_components
  means = radius * np.stack([np.cos(ang), np.sin(ang)], -1)
  # Elongated along the tangent (std x 1.3) and squeezed radially (std x 0.7).
  tang = np.stack([-np.sin(ang), np.cos(ang)], -1)
  rad = np.stack([np.cos(ang), np.sin(ang)], -1)
  covs = ((1.3 * std) ** 2 * np.einsum("ki,kj->kij", tang, tang)
          + (0.7 * std) ** 2 * np.einsum("ki,kj->kij", rad, rad))
  if weights is None:
    weights = np.arange(1, num_components + 1, dtype=np.float64)
  weights = np.asarray(weights, np.float64)
  return GaussianMixture(jnp.asarray(weights / weights.sum(), jnp.float32), jnp.asarray(means, jnp.float32),
                         jnp.asarray(covs, jnp.float32))
