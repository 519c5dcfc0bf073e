"""IR-SDE (Luo et al., ICML 2023), the restoration diffusion of DA-CLIP: a mean-reverting SDE from the clean
image x0 to the degraded image mu plus noise.

  dx = theta_t (mu - x) dt + sigma_t dW,      sigma_t^2 = 2 lambda^2 theta_t                 (Eq. 3 / 4)
  x_t | x0 ~ N(m_t, v_t),  m_t = mu + (x0 - mu) exp(-theta_bar_t dt),
                           v_t = lambda^2 (1 - exp(-2 theta_bar_t dt))                         (Eq. 5)
  x*_{t-1} = argmax p(x_{t-1} | x_t, x0)  (the Gaussian bridge posterior mean)                 (Eq. 8)

Discretisation as the official `IRSDE` (universal-image-restoration/utils/sde_utils.py): timesteps t = 1..T
(index 0 is the clean state); theta_t from a cosine schedule; theta_bar_t = sum_{s=1}^t theta_s (the official
subtracts theta_0); dt is chosen so that exp(-theta_bar_T dt) = eps (0.005 in the official train.yml), so the
terminal mean is mu up to 0.5% of (x0 - mu) and x_T ~ N(mu, lambda^2). Images are in [0, 1]; lambda = 50/255.

Every function is pure and works on any array shape; per-sample times t are [B] ints broadcast over the
trailing image axes.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks

__all__ = ["IRSDESchedule", "irsde_schedule", "cosine_thetas", "mean_factor", "irsde_mean", "irsde_std",
           "irsde_forward_sample", "forward_euler_step", "optimal_reverse_step", "optimal_reverse_std",
           "score_from_noise", "x0_from_noise", "reverse_sde_mean", "reverse_sde_step", "reverse_posterior_step",
           "matching_loss", "matching_loss_per_example", "reverse_sample", "reverse_sample_mean"]


@flax.struct.dataclass
class IRSDESchedule:
  """Tables of the discretised IR-SDE, indexed by t = 0..T.

  Attributes:
    thetas: [T + 1] theta_t.
    sigmas: [T + 1] sigma_t = sqrt(2 lambda^2 theta_t).
    thetas_cumsum: [T + 1] theta_bar_t = sum_{s=1}^t theta_s (theta_bar_0 = 0).
    sigma_bars: [T + 1] std of x_t | x0: lambda sqrt(1 - exp(-2 theta_bar_t dt)).
    dt: scalar step, -log(eps) / theta_bar_T.
    lambda_: the stationary std lambda (max_sigma in the official code).
  """

  thetas: jax.Array
  sigmas: jax.Array
  thetas_cumsum: jax.Array
  sigma_bars: jax.Array
  dt: jax.Array
  lambda_: jax.Array

  @property
  def num_steps(self) -> int:
    return int(self.thetas.shape[0]) - 1


def cosine_thetas(num_steps: int, s: float = 0.008) -> jax.Array:
  """The official cosine theta schedule: [T + 1] values 1 - abar(i) for i = 1..T+1 of a (T + 2)-step cosine.

  abar(x) = cos(((x / (T + 2)) + s) / (1 + s) * pi / 2)^2 / abar(0) (Nichol & Dhariwal's cosine, truncated
  at both ends as the official code does).

  Args:
    num_steps: T.
    s: the cosine's offset.

  Returns:
    float32 [T + 1] thetas in (0, 1).
  """
  n = num_steps + 2
  x = jnp.linspace(0.0, n, n + 1, dtype=jnp.float32)
  abar = jnp.cos(((x / n) + s) / (1 + s) * math.pi * 0.5) ** 2
  abar = abar / abar[0]
  return 1.0 - abar[1:-1]


def irsde_schedule(T: int = 100, lambda_: float = 50.0 / 255.0, schedule: str = "cosine",
                   eps: float = 0.005) -> IRSDESchedule:
  """Builds the IR-SDE tables.

  Args:
    T: number of steps (100 in the paper).
    lambda_: stationary noise std in image units ([0, 1] images); values >= 1 are read as 8-bit units and
      divided by 255, as the official `max_sigma` (50 -> 50 / 255).
    schedule: 'cosine' (the paper), 'linear' or 'constant' (the official alternatives).
    eps: exp(-theta_bar_T dt), the weight of x0 left in the terminal mean (official train.yml: 0.005).

  Returns:
    IRSDESchedule.
  """
  T = checks.static_int("daclip.irsde_schedule", "T", T, low=1)
  if not 0.0 < eps < 1.0:
    raise ValueError(f"eps={eps} must be in (0, 1): it is exp(-theta_bar_T dt), the x0 weight left at t = T.")
  lam = lambda_ / 255.0 if lambda_ >= 1 else lambda_
  if lam <= 0:
    raise ValueError(f"lambda_ must be positive, got {lambda_}.")
  if schedule == "cosine":
    thetas = cosine_thetas(T)
  elif schedule == "linear":
    scale = 1000.0 / (T + 1)
    thetas = jnp.linspace(scale * 1e-4, scale * 0.02, T + 1, dtype=jnp.float32)
  elif schedule == "constant":
    thetas = jnp.ones((T + 1,), jnp.float32)
  else:
    raise ValueError(f"unknown IR-SDE schedule '{schedule}'; choose 'cosine', 'linear' or 'constant'.")
  sigmas = jnp.sqrt(2.0 * lam ** 2 * thetas)                                  # sigma_t^2 = 2 lambda^2 theta_t
  thetas_cumsum = jnp.cumsum(thetas) - thetas[0]                              # theta_bar_0 = 0
  dt = -math.log(eps) / thetas_cumsum[-1]                                     # exp(-theta_bar_T dt) = eps
  sigma_bars = jnp.sqrt(lam ** 2 * -jnp.expm1(-2.0 * thetas_cumsum * dt))     # Eq. (5) variance
  return IRSDESchedule(thetas=thetas, sigmas=sigmas, thetas_cumsum=thetas_cumsum, sigma_bars=sigma_bars,
                       dt=jnp.asarray(dt, jnp.float32), lambda_=jnp.asarray(lam, jnp.float32))


def _lookup(table: jax.Array, t: Any, low: int = 0, where: str = "daclip.irsde") -> jax.Array:
  """table[t] for integer times; a time outside [low, len(table)) raises eagerly (checks.IndexRangeError) and
  reads NaN under jit (a gather would clamp it to the last step, silently)."""
  checks.dtype(where, "t", t, "integer", "integer step indices in 0..T.")
  n = table.shape[0]
  checks.require(where, (checks.xp(t).asarray(t) >= low) & (checks.xp(t).asarray(t) < n), checks.IndexRangeError,
                 f"times t must be integers in [{low}, {n - 1}] (the schedule's steps).")
  t = jnp.asarray(t, jnp.int32)
  return jnp.where((t >= low) & (t < n), table[jnp.clip(t, 0, n - 1)], jnp.nan)


def _at(table: jax.Array, t: Any, x: jax.Array) -> jax.Array:
  """table[t] broadcast against x: t scalar or [B] (B = x.shape[0]) -> [B, 1, ..., 1]."""
  if np.ndim(t) and np.shape(t) != x.shape[:1]:
    raise checks.ShapeError(f"daclip.irsde: times t {np.shape(t)} must be a scalar or one per sample "
                            f"({x.shape[0]},).")
  v = _lookup(table, t)
  if np.ndim(t) == 0:
    return v
  return v.reshape(np.shape(t) + (1,) * (x.ndim - 1))


def mean_factor(t: Any, schedule: IRSDESchedule) -> jax.Array:
  """exp(-theta_bar_t dt): the weight of x0 - mu left in the mean at time t (1 at t = 0, eps at t = T).

  Args:
    t: int times in 0..T, any shape.
    schedule: IRSDESchedule.

  Returns:
    float32 of t's shape.
  """
  return jnp.exp(-_lookup(schedule.thetas_cumsum, t) * schedule.dt)


def irsde_mean(x0: jax.Array, mu: jax.Array, t: Any, schedule: IRSDESchedule) -> jax.Array:
  """m_t = mu + (x0 - mu) exp(-theta_bar_t dt)  (Eq. 5). x0, mu [B, ...]; t scalar or [B].

  Args:
    x0: [B, ...] clean images.
    mu: [B, ...] degraded images.
    t: int time in 0..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    m_t [B, ...].

  Raises:
    ValueError: t neither a scalar nor [B].
  """
  return mu + (x0 - mu) * _at(jnp.exp(-schedule.thetas_cumsum * schedule.dt), t, x0)


def irsde_std(t: Any, schedule: IRSDESchedule) -> jax.Array:
  """sqrt(v_t) = lambda sqrt(1 - exp(-2 theta_bar_t dt))  (Eq. 5).

  Args:
    t: int times in 0..T, any shape.
    schedule: IRSDESchedule.

  Returns:
    float32 of t's shape (not broadcast against images).
  """
  return _lookup(schedule.sigma_bars, t)


def irsde_forward_sample(key: jax.Array, x0: jax.Array, mu: jax.Array, t: Any,
                         schedule: IRSDESchedule) -> jax.Array:
  """Samples x_t ~ N(m_t, v_t) in closed form (the official `generate_random_states`).

  Args:
    key: PRNG key.
    x0: clean images [B, ...].
    mu: degraded images [B, ...] (the SDE's mean-reversion target).
    t: int times in 1..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    x_t [B, ...].
  """
  if x0.shape != mu.shape:
    raise ValueError(f"x0 {x0.shape} and mu {mu.shape} must have the same shape.")
  noise = jax.random.normal(key, x0.shape, x0.dtype)
  return irsde_mean(x0, mu, t, schedule) + _at(schedule.sigma_bars, t, x0) * noise


def forward_euler_step(key: jax.Array, x: jax.Array, mu: jax.Array, t: Any, schedule: IRSDESchedule) -> jax.Array:
  """One Euler-Maruyama step t-1 -> t of dx = theta_t (mu - x) dt + sigma_t dW (the official `forward_step`).

  Args:
    key: PRNG key.
    x: [B, ...] state at t - 1.
    mu: [B, ...] degraded images.
    t: int time in 1..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    x_t [B, ...].
  """
  drift = _at(schedule.thetas, t, x) * (mu - x) * schedule.dt
  return x + drift + _at(schedule.sigmas, t, x) * jnp.sqrt(schedule.dt) * jax.random.normal(key, x.shape, x.dtype)


def optimal_reverse_step(x_t: jax.Array, x0: jax.Array, mu: jax.Array, t: Any, schedule: IRSDESchedule) -> jax.Array:
  """x*_{t-1}: the mean of p(x_{t-1} | x_t, x0), the Gaussian bridge posterior (Eq. 8; official
  `reverse_optimum_step`). With A = exp(-theta_t dt), B = exp(-theta_bar_t dt), C = exp(-theta_bar_{t-1} dt):

    x*_{t-1} - mu = A (1 - C^2) / (1 - B^2) (x_t - mu) + C (1 - A^2) / (1 - B^2) (x0 - mu).

  Args:
    x_t: states [B, ...]; x0: clean images [B, ...]; mu: degraded images [B, ...]; t: ints in 1..T.

  Returns:
    x*_{t-1} [B, ...].
  """
  # 1 - exp(-2 x) written as -expm1(-2 x): at small t the float32 difference would lose 3-4 digits.
  th = schedule.thetas * schedule.dt
  thb = schedule.thetas_cumsum * schedule.dt
  thb_prev = jnp.concatenate([thb[:1], thb[:-1]])                            # theta_bar_{t-1} dt
  a = _at(jnp.exp(-th), t, x_t)
  c = _at(jnp.exp(-thb_prev), t, x_t)
  one_a2 = _at(-jnp.expm1(-2 * th), t, x_t)
  one_b2 = _at(-jnp.expm1(-2 * thb), t, x_t)
  one_c2 = _at(-jnp.expm1(-2 * thb_prev), t, x_t)
  term1 = a * one_c2 / one_b2
  term2 = c * one_a2 / one_b2
  return term1 * (x_t - mu) + term2 * (x0 - mu) + mu


def optimal_reverse_std(t: Any, schedule: IRSDESchedule) -> jax.Array:
  """Std of p(x_{t-1} | x_t, x0): lambda sqrt((1 - A^2)(1 - C^2) / (1 - B^2)) (official `reverse_optimum_std`,
  with its floor of 1e-20 dt on the variance).

  Args:
    t: int times in 1..T (t = 0 would read theta_bar_{-1}, the last entry), any shape.
    schedule: IRSDESchedule.

  Returns:
    float32 of t's shape.
  """
  one_a2 = -jnp.expm1(-2 * _lookup(schedule.thetas, t, low=1) * schedule.dt)
  one_b2 = -jnp.expm1(-2 * _lookup(schedule.thetas_cumsum, t, low=1) * schedule.dt)
  one_c2 = -jnp.expm1(-2 * _lookup(schedule.thetas_cumsum, jnp.asarray(t, jnp.int32) - 1) * schedule.dt)
  var = one_a2 * one_c2 / one_b2
  return jnp.sqrt(jnp.maximum(var, 1e-20 * schedule.dt)) * schedule.lambda_


def score_from_noise(noise: jax.Array, t: Any, schedule: IRSDESchedule) -> jax.Array:
  """Score grad log p_t(x) = -noise / sqrt(v_t) for a predicted standard-normal noise [B, ...].

  Args:
    noise: [B, ...] predicted noise.
    t: int time in 1..T (v_t > 0), a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    score [B, ...].
  """
  return -noise / _at(schedule.sigma_bars, t, noise)


def x0_from_noise(x_t: jax.Array, noise: jax.Array, mu: jax.Array, t: Any, schedule: IRSDESchedule) -> jax.Array:
  """x0 = (x_t - mu - sqrt(v_t) noise) exp(theta_bar_t dt) + mu (official `get_init_state_from_noise`).

  Args:
    x_t: [B, ...] states.
    noise: [B, ...] predicted noise.
    mu: [B, ...] degraded images.
    t: int time in 0..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    x0 estimate [B, ...] (not clipped).
  """
  inv = _at(jnp.exp(schedule.thetas_cumsum * schedule.dt), t, x_t)
  return (x_t - mu - _at(schedule.sigma_bars, t, x_t) * noise) * inv + mu


def reverse_sde_mean(x_t: jax.Array, score: jax.Array, mu: jax.Array, t: Any, schedule: IRSDESchedule) -> jax.Array:
  """Mean of one reverse-SDE step t -> t-1: x - (theta_t (mu - x) - sigma_t^2 score) dt  (Eq. 7, Euler).

  Args:
    x_t: [B, ...] states.
    score: [B, ...] score at x_t.
    mu: [B, ...] degraded images.
    t: int time in 1..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    [B, ...] mean of x_{t-1}.
  """
  th = _at(schedule.thetas, t, x_t)
  sig2 = _at(schedule.sigmas, t, x_t) ** 2
  return x_t - (th * (mu - x_t) - sig2 * score) * schedule.dt


def reverse_sde_step(key: jax.Array, x_t: jax.Array, score: jax.Array, mu: jax.Array, t: Any,
                     schedule: IRSDESchedule) -> jax.Array:
  """One reverse-SDE Euler-Maruyama step t -> t-1 (official `reverse_sde_step`).

  Args:
    key: PRNG key.
    x_t: [B, ...] states.
    score: [B, ...] score at x_t.
    mu: [B, ...] degraded images.
    t: int time in 1..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    x_{t-1} [B, ...].
  """
  noise = jax.random.normal(key, x_t.shape, x_t.dtype)
  return reverse_sde_mean(x_t, score, mu, t, schedule) - _at(schedule.sigmas, t, x_t) * jnp.sqrt(schedule.dt) * noise


def reverse_posterior_step(key: jax.Array, x_t: jax.Array, noise_pred: jax.Array, mu: jax.Array, t: Any,
                           schedule: IRSDESchedule) -> jax.Array:
  """One posterior-sampling step: x0 from the predicted noise, then a draw from p(x_{t-1} | x_t, x0).

  Args:
    key: PRNG key.
    x_t: [B, ...] states.
    noise_pred: [B, ...] predicted noise.
    mu: [B, ...] degraded images.
    t: int time in 1..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    x_{t-1} [B, ...].
  """
  x0 = x0_from_noise(x_t, noise_pred, mu, t, schedule)
  mean = optimal_reverse_step(x_t, x0, mu, t, schedule)
  std = optimal_reverse_std(t, schedule)
  std = std.reshape(std.shape + (1,) * (x_t.ndim - std.ndim)) if std.ndim else std
  return mean + std * jax.random.normal(key, x_t.shape, x_t.dtype)


def matching_loss(noise_pred: jax.Array, x_t: jax.Array, x0: jax.Array, mu: jax.Array, t: Any,
                  schedule: IRSDESchedule) -> jax.Array:
  """IR-SDE's maximum-likelihood loss: L1 between the network's reverse step and the optimal one (Eq. 9;
  official `MatchingLoss('l1')`, unweighted): mean |reverse_sde_mean(x_t, score(noise_pred)) - x*_{t-1}|.

  Args:
    noise_pred: [B, ...] predicted noise at x_t.
    x_t: [B, ...] states (e.g. from `irsde_forward_sample`).
    x0: [B, ...] clean images.
    mu: [B, ...] degraded images.
    t: int time in 1..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    scalar mean L1 loss.
  """
  return jnp.mean(matching_loss_per_example(noise_pred, x_t, x0, mu, t, schedule))


def matching_loss_per_example(noise_pred: jax.Array, x_t: jax.Array, x0: jax.Array, mu: jax.Array, t: Any,
                              schedule: IRSDESchedule) -> jax.Array:
  """`matching_loss` of each example: mean |reverse_sde_mean(x_t, score(noise_pred)) - x*_{t-1}| over its pixels.

  The mean of the [B] values is `matching_loss` (every example has the same number of pixels); a held-out
  evaluation averages them per image.

  Args:
    noise_pred: [B, ...] predicted noise at x_t.
    x_t: [B, ...] states.
    x0: [B, ...] clean images.
    mu: [B, ...] degraded images.
    t: int time in 1..T, a scalar or [B].
    schedule: IRSDESchedule.

  Returns:
    [B] L1 losses.
  """
  pred = reverse_sde_mean(x_t, score_from_noise(noise_pred, t, schedule), mu, t, schedule)
  target = optimal_reverse_step(x_t, x0, mu, t, schedule)
  return jnp.mean(jnp.abs(pred - target).reshape(x_t.shape[0], -1), axis=1)


def reverse_sample(key: jax.Array, params: Any, lq_image: jax.Array, *, noise_fn: Callable, schedule: IRSDESchedule,
            method: str = "posterior", **cond: Any) -> jax.Array:
  """Restores degraded images by running the reverse IR-SDE from x_T = mu + lambda z (mu = the degraded image).

  The loop over t = T..1 is one `lax.scan` (compile once; jit or vmap the call).

  Args:
    key: PRNG key.
    params: the noise network's parameters.
    lq_image: degraded images mu [B, H, W, C] in [0, 1].
    noise_fn: noise_fn(params, x_t, mu, t [B], **cond) -> predicted noise [B, H, W, C].
    schedule: IRSDESchedule.
    method: 'posterior' (the official test and validation, options/test.yml `sampling_mode: posterior`: ancestral
      steps from p(x_{t-1} | x_t, x0_hat), official `reverse_posterior`) or 'sde' (reverse-SDE Euler-Maruyama,
      official `reverse_sde`, the `sampling_mode: sde` alternative).
    **cond: extra arguments for noise_fn (e.g. e_c, e_d embeddings [B, D]).

  Returns:
    restored images [B, H, W, C] (not clipped).
  """
  if method not in ("sde", "posterior"):
    raise ValueError(f"unknown restore method '{method}'; choose 'sde' or 'posterior'.")
  mu = jnp.asarray(lq_image, jnp.float32)
  key_init, key_steps = jax.random.split(key)
  x = mu + schedule.lambda_ * jax.random.normal(key_init, mu.shape, mu.dtype)   # official noise_state
  steps = jnp.arange(schedule.num_steps, 0, -1)
  b = mu.shape[0]

  def body(x, inputs):
    t, k = inputs
    tb = jnp.full((b,), t, jnp.int32)
    noise = noise_fn(params, x, mu, tb, **cond)
    if method == "sde":
      x = reverse_sde_step(k, x, score_from_noise(noise, tb, schedule), mu, tb, schedule)
    else:
      x = reverse_posterior_step(k, x, noise, mu, tb, schedule)
    return x, None

  x, _ = jax.lax.scan(body, x, (steps, jax.random.split(key_steps, schedule.num_steps)))
  return x


def reverse_sample_mean(key: jax.Array, params: Any, lq_image: jax.Array, *, noise_fn: Callable,
                        schedule: IRSDESchedule, num_samples: int, method: str = "posterior",
                        **cond: Any) -> jax.Array:
  """The mean of `num_samples` independent reverse chains from the same degraded images: a Monte Carlo estimate of
  the posterior mean E[x0 | mu], the estimate PSNR rewards.

  One sample of an exact sampler is the posterior mean plus posterior noise, so its squared error is the MMSE plus
  the posterior variance (twice the MMSE for a Gaussian posterior: 3 dB of PSNR); the mean of K samples keeps
  1 / K of that variance. The K chains run one after another (`lax.map`): memory stays that of one chain.

  Args:
    key: PRNG key (chain k uses fold_in(key, k)).
    params: the noise network's parameters.
    lq_image: degraded images mu [B, H, W, C].
    noise_fn: as in `reverse_sample`.
    schedule: IRSDESchedule.
    num_samples: K >= 1 chains.
    method: 'posterior' or 'sde' (`reverse_sample`).
    **cond: extra arguments for noise_fn.

  Returns:
    [B, H, W, C] mean of the K restorations (not clipped).

  Raises:
    ValueError: num_samples < 1.
  """
  if int(num_samples) < 1:
    raise ValueError(f"num_samples must be >= 1 (chains to average), got {num_samples}.")
  keys = jax.vmap(lambda k: jax.random.fold_in(key, k))(jnp.arange(int(num_samples)))
  samples = jax.lax.map(lambda k: reverse_sample(k, params, lq_image, noise_fn=noise_fn, schedule=schedule,
                                                 method=method, **cond), keys)
  return jnp.mean(samples, axis=0)
