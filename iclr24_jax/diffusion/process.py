"""The forward process q(x_t | x_0), the posterior q(x_s | x_t, x_0), and eps / x0 / v conversions.

Every function takes alpha_bar values directly (a scalar, or [B] for one noise level per example), so it serves
discrete and continuous schedules alike and works for any data shape [B, ...] (images, vectors, latents).
Write alpha = sqrt(alpha_bar) and sigma = sqrt(1 - alpha_bar); then
  x_t = alpha x_0 + sigma eps                               # DDPM Eq. (4) reparameterised
  v   = alpha eps - sigma x_0                               # Salimans & Ho 2022, Sec. 4 ("v-prediction")
  x_0 = (x_t - sigma eps) / alpha = alpha x_t - sigma v
  eps = (x_t - alpha x_0) / sigma = sigma x_t + alpha v
  score = grad log q(x_t) = -E[eps | x_t] / sigma           # Tweedie / Vincent 2011
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

PREDICTIONS = ("eps", "x0", "v")


def expand(a: jax.Array, x: jax.Array) -> jax.Array:
  """Reshapes a scalar or per-example array a [B] so it broadcasts against x [B, ...] (-> [B, 1, ..., 1]).

  Args:
    a: scalar or [B] coefficient (cast to float32).
    x: [B, ...] array whose rank and batch size `a` must match.

  Returns:
    float32: the scalar unchanged, or a [B, 1, ..., 1] array of rank x.ndim.

  Raises:
    ValueError: a is neither a scalar nor of shape [B] with B = x.shape[0].
  """
  a = jnp.asarray(a, jnp.float32)
  if a.ndim == 0:
    return a
  if a.ndim != 1 or a.shape[0] != x.shape[0]:
    raise ValueError(f"a per-example coefficient must be a scalar or [B] with B = {x.shape[0]}, got {a.shape}.")
  return a.reshape(a.shape + (1,) * (x.ndim - 1))


def _check_prediction(prediction: str) -> None:
  if prediction not in PREDICTIONS:
    raise ValueError(f"unknown prediction type '{prediction}'; choose one of {PREDICTIONS}.")


# -------------------------------------------------------------------------------------- forward process


def q_mean_var(x0: jax.Array, alpha_bar: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean and variance of q(x_t | x_0) = N(sqrt(abar) x_0, (1 - abar) I).   # DDPM Eq. (4)

  Args:
    x0: [B, ...] clean data.
    alpha_bar: scalar or [B].

  Returns:
    (mean [B, ...], var broadcastable to x0).
  """
  a = expand(alpha_bar, x0)
  return jnp.sqrt(a) * x0, 1.0 - a


def q_sample(x0: jax.Array, alpha_bar: jax.Array, noise: jax.Array) -> jax.Array:
  """Draws x_t = sqrt(abar) x_0 + sqrt(1 - abar) eps.   # DDPM Eq. (4), Algorithm 1 line 5

  Args:
    x0: [B, ...] clean data.
    alpha_bar: scalar or [B].
    noise: eps ~ N(0, I), same shape as x0.

  Returns:
    x_t [B, ...].
  """
  if noise.shape != x0.shape:
    raise ValueError(f"noise shape {noise.shape} differs from x0 shape {x0.shape}.")
  a = expand(alpha_bar, x0)
  return jnp.sqrt(a) * x0 + jnp.sqrt(1.0 - a) * noise


def q_sample_step(x_s: jax.Array, alpha_bar_s: jax.Array, alpha_bar_t: jax.Array, noise: jax.Array) -> jax.Array:
  """One forward transition q(x_t | x_s) = N(sqrt(abar_t / abar_s) x_s, (1 - abar_t / abar_s) I), s < t.

  With s = t - 1 this is DDPM Eq. (2): q(x_t | x_{t-1}) = N(sqrt(1 - beta_t) x_{t-1}, beta_t I).

  Args:
    x_s: [B, ...] data at the less noisy time s.
    alpha_bar_s: scalar or [B], abar at s (1 for clean data).
    alpha_bar_t: scalar or [B], abar at t (abar_t <= abar_s).
    noise: eps ~ N(0, I), same shape as x_s (not checked).

  Returns:
    x_t [B, ...].
  """
  a = expand(alpha_bar_t, x_s) / expand(alpha_bar_s, x_s)
  return jnp.sqrt(a) * x_s + jnp.sqrt(1.0 - a) * noise


# ------------------------------------------------------------------------------------------- posterior


def posterior_mean_var(x_t: jax.Array, x0: jax.Array, alpha_bar_t: jax.Array, alpha_bar_s: jax.Array
                       ) -> tuple[jax.Array, jax.Array]:
  """Mean and variance of q(x_s | x_t, x_0) for s < t (s = t - 1 in DDPM).   # DDPM Eqs. (6)-(7)

  With alpha_{t|s} = abar_t / abar_s and beta_{t|s} = 1 - alpha_{t|s} (= alpha_t, beta_t when s = t - 1):
    mean = sqrt(abar_s) beta_{t|s} / (1 - abar_t) x_0 + sqrt(alpha_{t|s}) (1 - abar_s) / (1 - abar_t) x_t
    var  = (1 - abar_s) / (1 - abar_t) beta_{t|s}                       (DDPM's beta-tilde)
  abar_s = 1 (s is clean data) gives mean = x_0, var = 0.

  Args:
    x_t: [B, ...] noisy data at time t.
    x0: [B, ...] clean data (or a prediction of it).
    alpha_bar_t, alpha_bar_s: scalars or [B], abar_t < abar_s.

  Returns:
    (mean [B, ...], var broadcastable to x_t).
  """
  a_t, a_s = expand(alpha_bar_t, x_t), expand(alpha_bar_s, x_t)
  alpha_ts = a_t / a_s
  beta_ts = 1.0 - alpha_ts
  coef_x0 = jnp.sqrt(a_s) * beta_ts / (1.0 - a_t)
  coef_xt = jnp.sqrt(alpha_ts) * (1.0 - a_s) / (1.0 - a_t)
  var = (1.0 - a_s) / (1.0 - a_t) * beta_ts
  return coef_x0 * x0 + coef_xt * x_t, var


# ------------------------------------------------------------------------------------------ conversions


def eps_to_x0(x_t, eps, alpha_bar):
  """x_0 = (x_t - sqrt(1 - abar) eps) / sqrt(abar).   # DDPM Eq. (4) solved for x_0; DDIM Eq. (9)

  Args:
    x_t: [B, ...] noisy data.
    eps: [B, ...] noise (prediction), same shape as x_t.
    alpha_bar: scalar or [B] noise level of x_t, in (0, 1].

  Returns:
    x_0 estimate [B, ...].
  """
  a = expand(alpha_bar, x_t)
  return (x_t - jnp.sqrt(1.0 - a) * eps) / jnp.sqrt(a)


def x0_to_eps(x_t, x0, alpha_bar):
  """eps = (x_t - sqrt(abar) x_0) / sqrt(1 - abar).

  Args:
    x_t: [B, ...] noisy data.
    x0: [B, ...] clean data (prediction), same shape as x_t.
    alpha_bar: scalar or [B] noise level of x_t, in [0, 1) (abar = 1 divides by zero).

  Returns:
    eps estimate [B, ...].
  """
  a = expand(alpha_bar, x_t)
  return (x_t - jnp.sqrt(a) * x0) / jnp.sqrt(1.0 - a)


def v_to_x0(x_t, v, alpha_bar):
  """x_0 = alpha x_t - sigma v.   # Salimans & Ho 2022

  Args:
    x_t: [B, ...] noisy data.
    v: [B, ...] v-prediction, same shape as x_t.
    alpha_bar: scalar or [B] noise level of x_t, in [0, 1].

  Returns:
    x_0 estimate [B, ...].
  """
  a = expand(alpha_bar, x_t)
  return jnp.sqrt(a) * x_t - jnp.sqrt(1.0 - a) * v


def v_to_eps(x_t, v, alpha_bar):
  """eps = sigma x_t + alpha v.

  Args:
    x_t: [B, ...] noisy data.
    v: [B, ...] v-prediction, same shape as x_t.
    alpha_bar: scalar or [B] noise level of x_t, in [0, 1].

  Returns:
    eps estimate [B, ...].
  """
  a = expand(alpha_bar, x_t)
  return jnp.sqrt(1.0 - a) * x_t + jnp.sqrt(a) * v


def to_v(x0, eps, alpha_bar):
  """v = alpha eps - sigma x_0.   # Salimans & Ho 2022, Sec. 4

  Args:
    x0: [B, ...] clean data.
    eps: [B, ...] noise, same shape as x0.
    alpha_bar: scalar or [B] noise level, in [0, 1].

  Returns:
    v [B, ...].
  """
  a = expand(alpha_bar, x0)
  return jnp.sqrt(a) * eps - jnp.sqrt(1.0 - a) * x0


def eps_to_score(eps, alpha_bar):
  """score = -eps / sqrt(1 - abar) (the score of q(x_t) when eps = E[eps | x_t]).

  Args:
    eps: [B, ...] noise prediction.
    alpha_bar: scalar or [B] noise level, in [0, 1).

  Returns:
    score [B, ...].
  """
  return -eps / jnp.sqrt(1.0 - expand(alpha_bar, eps))


def score_to_eps(score, alpha_bar):
  """eps = -sqrt(1 - abar) score.

  Args:
    score: [B, ...] score grad log q(x_t).
    alpha_bar: scalar or [B] noise level, in [0, 1].

  Returns:
    eps [B, ...].
  """
  return -jnp.sqrt(1.0 - expand(alpha_bar, score)) * score


def predict_x0(x_t, model_out, alpha_bar, prediction: str = "eps"):
  """A network output of type `prediction` ('eps' | 'x0' | 'v') -> the x_0 estimate [B, ...].

  Args:
    x_t: [B, ...] noisy input the network saw.
    model_out: [B, ...] network output, same shape as x_t.
    alpha_bar: scalar or [B] noise level of x_t.
    prediction: what the network predicts: 'eps', 'x0' or 'v'.

  Returns:
    x_0 estimate [B, ...] (model_out itself when prediction == 'x0').

  Raises:
    ValueError: unknown prediction type.
  """
  _check_prediction(prediction)
  if prediction == "eps":
    return eps_to_x0(x_t, model_out, alpha_bar)
  if prediction == "x0":
    return model_out
  return v_to_x0(x_t, model_out, alpha_bar)


def predict_eps(x_t, model_out, alpha_bar, prediction: str = "eps"):
  """A network output of type `prediction` -> the eps estimate [B, ...].

  Args:
    x_t: [B, ...] noisy input the network saw.
    model_out: [B, ...] network output, same shape as x_t.
    alpha_bar: scalar or [B] noise level of x_t.
    prediction: what the network predicts: 'eps', 'x0' or 'v'.

  Returns:
    eps estimate [B, ...] (model_out itself when prediction == 'eps').

  Raises:
    ValueError: unknown prediction type.
  """
  _check_prediction(prediction)
  if prediction == "eps":
    return model_out
  if prediction == "x0":
    return x0_to_eps(x_t, model_out, alpha_bar)
  return v_to_eps(x_t, model_out, alpha_bar)


def convert(x_t, model_out, alpha_bar, source: str, target: str):
  """Converts a prediction between types ('eps', 'x0', 'v') at noise level alpha_bar.

  Args:
    x_t: [B, ...] noisy input the prediction refers to.
    model_out: [B, ...] prediction of type `source`.
    alpha_bar: scalar or [B] noise level of x_t.
    source: type of model_out: 'eps', 'x0' or 'v'.
    target: wanted type: 'eps', 'x0' or 'v'.

  Returns:
    [B, ...] prediction of type `target` (model_out unchanged when source == target).

  Raises:
    ValueError: unknown source or target type.
  """
  _check_prediction(source)
  _check_prediction(target)
  if source == target:
    return model_out
  x0 = predict_x0(x_t, model_out, alpha_bar, source)
  eps = predict_eps(x_t, model_out, alpha_bar, source)
  return {"x0": x0, "eps": eps, "v": to_v(x0, eps, alpha_bar)}[target]


def target_for(x0, noise, alpha_bar, prediction: str = "eps"):
  """The regression target of the training loss for a prediction type (eps, x_0 or v).

  Args:
    x0: [B, ...] clean data.
    noise: [B, ...] eps used to draw x_t, same shape as x0.
    alpha_bar: scalar or [B] noise level of x_t (only used for 'v').
    prediction: 'eps' (target = noise), 'x0' (target = x0) or 'v'.

  Returns:
    target [B, ...].

  Raises:
    ValueError: unknown prediction type.
  """
  _check_prediction(prediction)
  if prediction == "eps":
    return noise
  if prediction == "x0":
    return x0
  return to_v(x0, noise, alpha_bar)


@flax.struct.dataclass
class Gaussian:
  """A diagonal Gaussian N(mean, var) over [B, ...]; var broadcasts against mean (a scalar or [B, 1, ...])."""

  mean: jax.Array
  var: jax.Array

  def sample(self, key: jax.Array) -> jax.Array:
    """x = mean + sqrt(var) z, z ~ N(0, I): one draw [B, ...] of the mean's shape and dtype."""
    return self.mean + jnp.sqrt(self.var) * jax.random.normal(key, self.mean.shape, self.mean.dtype)

  def log_prob(self, x: jax.Array) -> jax.Array:
    """Log density [B], summed over all but the batch axis (needs var > 0)."""
    var = jnp.broadcast_to(self.var, self.mean.shape)
    lp = -0.5 * (jnp.log(2 * jnp.pi * var) + (x - self.mean) ** 2 / var)
    return jnp.sum(lp.reshape(lp.shape[0], -1), axis=-1)
