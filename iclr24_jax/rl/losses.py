"""GAE and the PPO losses as reusable pure functions.

Conventions: arrays are time-major `[T, ...]` for GAE; losses take flat or batched arrays `[...]` and
reduce with a mean (optionally weighted). Booleans may be bool or float.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks


def gae(rewards: jax.Array, values: jax.Array, next_values: jax.Array, terminations: jax.Array,
        dones: jax.Array, gamma: float, gae_lambda: float) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation (Schulman et al. 2016), exact under time limits.

  delta_t = r_t + gamma (1 - term_t) V(s'_t) - V(s_t)
  A_t     = delta_t + gamma lambda (1 - done_t) A_{t+1}
  where s'_t is the state reached by step t *before* any auto-reset, so a truncated step (done, not terminal)
  still bootstraps from V(s'_t), and the recursion never crosses an episode boundary.

  Args:
    rewards: [T, ...].
    values: [T, ...] V(s_t).
    next_values: [T, ...] V(s'_t) (= values[t + 1] inside an episode; the value of the final observation at a
      truncation; anything at a termination, it is masked).
    terminations: [T, ...] true where s'_t is terminal.
    dones: [T, ...] true where the episode ended at t (terminated or truncated).
    gamma: discount.
    gae_lambda: GAE lambda.

  Returns:
    (advantages [T, ...], returns = advantages + values [T, ...]); NaN under jit for a traced gamma or
    gae_lambda outside [0, 1] (Python numbers raise at once).
  """
  if not (rewards.shape == values.shape == next_values.shape == terminations.shape == dones.shape):
    raise checks.ShapeError(f"rl.gae: shapes differ: rewards {rewards.shape}, values {values.shape}, next_values "
                            f"{next_values.shape}, terminations {terminations.shape}, dones {dones.shape}.")
  checks.nonempty("rl.gae", "rewards", rewards.shape[0] if rewards.ndim else 0, "time steps")
  ok = checks.all_ok(checks.in_range("rl.gae", "gamma", gamma, 0.0, 1.0, hint="the discount."),
                     checks.in_range("rl.gae", "gae_lambda", gae_lambda, 0.0, 1.0))
  not_term = 1.0 - terminations.astype(values.dtype)
  not_done = 1.0 - dones.astype(values.dtype)
  deltas = rewards + gamma * not_term * next_values - values

  def body(acc, xs):
    delta, nd = xs
    acc = delta + gamma * gae_lambda * nd * acc
    return acc, acc

  _, adv = jax.lax.scan(body, jnp.zeros_like(values[0]), (deltas, not_done), reverse=True)
  return checks.poison((adv, adv + values), ok)


def gae_from_dones(rewards: jax.Array, values: jax.Array, dones: jax.Array, last_value: jax.Array, gamma: float,
                   gae_lambda: float) -> tuple[jax.Array, jax.Array]:
  """PureJaxRL's GAE: every done is treated as terminal and V(s_{t+1}) comes from the next row.

  Args:
    rewards, values, dones: [T, ...]; last_value: [...] V of the observation after the last step.

  Returns:
    (advantages, returns) [T, ...].
  """
  if np.shape(last_value) != np.shape(values)[1:]:
    raise checks.ShapeError(f"rl.gae_from_dones: last_value must be values[0]'s shape {np.shape(values)[1:]}; got "
                            f"{np.shape(last_value)}.")
  next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
  return gae(rewards, values, next_values, dones, dones, gamma, gae_lambda)


class PPOStats(NamedTuple):
  approx_kl: jax.Array
  clip_fraction: jax.Array
  ratio_mean: jax.Array


def _wmean(x: jax.Array, weights: jax.Array | None) -> jax.Array:
  if weights is None:
    return jnp.mean(x)
  return jnp.mean(weights * x)


def ppo_clip_objective(log_prob: jax.Array, old_log_prob: jax.Array, advantages: jax.Array, clip_eps: float = 0.2,
                       weights: jax.Array | None = None,
                       clip_eps_high: float | None = None) -> tuple[jax.Array, PPOStats]:
  """The PPO clipped surrogate as a loss to minimise (Schulman et al. 2017, Eq. 7).

  L = -mean_i w_i min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps_high) A_i),  rho_i = exp(log_prob_i - old_log_prob_i)

  Args:
    log_prob: [...] log pi_theta(a|s) (differentiable).
    old_log_prob: [...] log pi_old(a|s) of the behaviour policy (treated as constant).
    advantages: [...] (normalise beforehand if wanted).
    clip_eps: eps of the clip.
    weights: optional [...] per-sample weights; the mean is mean(w * term), so w = 1 is plain PPO (normalise the
      weights yourself if their mean should be 1).
    clip_eps_high: upper clip (default = clip_eps; asymmetric clipping otherwise).

  Returns:
    (loss scalar, PPOStats(approx_kl = mean((rho - 1) - log rho), clip_fraction, ratio_mean)).
  """
  where = "rl.ppo_clip_objective"
  checks.in_range(where, "clip_eps", clip_eps, 0.0, None, low_open=True)
  checks.in_range(where, "clip_eps_high", clip_eps_high, 0.0, None, low_open=True)
  if np.shape(log_prob) != np.shape(old_log_prob) or np.shape(advantages) != np.shape(log_prob):
    raise checks.ShapeError(f"{where}: log_prob {np.shape(log_prob)}, old_log_prob {np.shape(old_log_prob)} and "
                            f"advantages {np.shape(advantages)} must have one shape.")
  high = clip_eps if clip_eps_high is None else clip_eps_high
  log_ratio = log_prob - jax.lax.stop_gradient(old_log_prob)
  ratio = jnp.exp(log_ratio)
  unclipped = ratio * advantages
  clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
  loss = -_wmean(jnp.minimum(unclipped, clipped), weights)
  stats = PPOStats(approx_kl=jnp.mean((ratio - 1.0) - log_ratio),
                   clip_fraction=jnp.mean((jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32)),
                   ratio_mean=jnp.mean(ratio))
  return loss, jax.tree.map(jax.lax.stop_gradient, stats)


def value_loss(values: jax.Array, returns: jax.Array, old_values: jax.Array | None = None,
               clip_eps: float | None = None, weights: jax.Array | None = None) -> jax.Array:
  """0.5 * mean squared error to the returns, optionally PPO-clipped around the old values.

  With clipping: 0.5 * mean max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2).

  Args:
    values: [...] predictions; returns: [...] targets (treated as constant).
    old_values: [...] values at collection time (needed for clipping).
    clip_eps: None or 0 for no clipping.
    weights: optional per-sample weights (mean(w * term)).

  Returns:
    scalar loss.
  """
  if np.shape(values) != np.shape(returns):
    raise checks.ShapeError(f"rl.value_loss: values {np.shape(values)} and returns {np.shape(returns)} must have one "
                            "shape (a [B, 1] head against [B] returns would broadcast to [B, B]).")
  returns = jax.lax.stop_gradient(returns)
  err = jnp.square(values - returns)
  if clip_eps:
    if old_values is None:
      raise ValueError("value_loss: clip_eps needs old_values.")
    old_values = jax.lax.stop_gradient(old_values)
    v_clip = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
    err = jnp.maximum(err, jnp.square(v_clip - returns))
  return 0.5 * _wmean(err, weights)


def normalize_advantages(adv: jax.Array, eps: float = 1e-8) -> jax.Array:
  """(A - mean A) / (std A + eps) over all entries.

  Args:
    adv: advantages of any shape, e.g. [T, B] (mean and std are over every entry).
    eps: added to the standard deviation.

  Returns:
    normalised advantages, adv's shape.
  """
  return (adv - jnp.mean(adv)) / (jnp.std(adv) + eps)


def ppo_loss(dist, values: jax.Array, batch: dict, *, clip_eps: float = 0.2, vf_coef: float = 0.5,
             ent_coef: float = 0.0, value_clip_eps: float | None = None, normalize_adv: bool = True,
             weights: jax.Array | None = None, key: jax.Array | None = None) -> tuple[jax.Array, dict]:
  """The full PPO loss from a policy distribution and value predictions on a minibatch.

  total = policy_loss + vf_coef * value_loss - ent_coef * entropy

  Args:
    dist: the current policy's distribution on batch['obs'] (distributions.*), batch shape [...].
    values: [...] current value predictions.
    batch: dict with 'action' (raw, [..., A] or [...]), 'log_prob' [...], 'advantage' [...], 'return' [...],
      and 'value' [...] (the old values; needed only with value_clip_eps).
    clip_eps, vf_coef, ent_coef, value_clip_eps, normalize_adv: PPO hyper-parameters.
    weights: optional per-sample weights [...] for the policy and value terms.
    key: for the tanh-Gaussian entropy estimate (None: at the mean).

  Returns:
    (total loss, metrics dict).
  """
  adv = batch["advantage"]
  if normalize_adv:
    adv = normalize_advantages(adv)
  log_prob = dist.log_prob(batch["action"])
  pg, stats = ppo_clip_objective(log_prob, batch["log_prob"], adv, clip_eps, weights)
  vl = value_loss(values, batch["return"], batch.get("value"), value_clip_eps, weights)
  ent = jnp.mean(dist.entropy(key))
  total = pg + vf_coef * vl - ent_coef * ent
  metrics = {"loss": total, "policy_loss": pg, "value_loss": vl, "entropy": ent, "approx_kl": stats.approx_kl,
             "clip_fraction": stats.clip_fraction}
  return total, metrics
