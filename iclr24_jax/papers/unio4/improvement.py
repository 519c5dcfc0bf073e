"""Offline multi-step policy improvement (official abppo.py / main.py).

Each ensemble member i keeps a behaviour policy pi_old_i (initially its BC policy). One step, per member:
  s ~ D (a minibatch), a ~ pi_old_i(.|s) (the behaviour policy samples the actions, `dist.rsample()` under no_grad),
  A = Q(s, a) - V(s), normalised over the minibatch, weighted by omega where A > 0 and 1 - omega elsewhere
  (unweighted at omega = 0.5, as the official `weighted_advantage`),
  loss_i = -mean[ min(r A, clip(r, 1 - eps, 1 + eps) A) ],  r = pi_i(a|s) / pi_old_i(a|s)   (PPO, eps = 0.25),
  Adam with the learning rate decayed linearly to 0, gradient norm clipped at 0.5 per policy.
Every `eval_every` steps the OPE scores every current policy; where the score beats that member's best so far,
the behaviour policy is replaced by the current one ("replace if better") and the best score updated.
Without replacement (`replace=False`) this is a one-step method: every update stays anchored to the BC policy.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.unio4 import stages
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.rl import losses, normalization

CONST_EPS = 1e-10  # the official util.CONST_EPS


def normalize_advantage(adv: jax.Array, eps: float = CONST_EPS) -> jax.Array:
  """(A - mean A) / (std A + eps) with torch's unbiased std (ddof = 1), as the official code: [B] -> [B]."""
  checks.nonempty("unio4.normalize_advantage", "adv", int(np.size(adv)), "advantages")
  checks.in_range("unio4.normalize_advantage", "eps", eps, 0.0, None, low_open=True)
  # official: Lei-Kun/Uni-O4@1eecc45 abppo.py:238
  return (adv - jnp.mean(adv)) / (jnp.std(adv, ddof=1) + eps)


def advantage_weights(adv: jax.Array, omega: float) -> jax.Array:
  """omega where A > 0, 1 - omega elsewhere; all 1 at omega = 0.5 (official `weighted_advantage`, abppo.py).

  The official code returns A unweighted when omega == 0.5 (not 0.5 A), so omega = 0.5 is plain PPO with the full
  loss and gradient (the 0.5 gradient-norm clip then acts at the official norm); any other omega multiplies A by
  these weights.

  Args:
    adv: [...] (normalised) advantages.
    omega: weight of positive advantages in [0, 1] (a Python float or a scalar array).

  Returns:
    [...] float32 weights (NaN under jit for a traced omega outside [0, 1]; a Python omega raises at once).
  """
  ok = checks.in_range("unio4.advantage_weights", "omega", omega, 0.0, 1.0, hint="0.5 is plain PPO.")
  # official: Lei-Kun/Uni-O4@1eecc45 abppo.py:324-336 (weighted_advantage)
  w = jnp.where(adv > 0, omega, 1.0 - omega).astype(jnp.float32)
  return checks.poison(jnp.where(jnp.asarray(omega) == 0.5, jnp.ones_like(w), w), ok)


def asymmetric_clipped_objective(log_prob: jax.Array, old_log_prob: jax.Array, adv: jax.Array, clip_eps: float,
                                 omega: float) -> tuple[jax.Array, Any]:
  """-mean[ w(A) min(r A, clip(r, 1 - eps, 1 + eps) A) ] with w(A) = omega (A > 0) or 1 - omega (1 at omega 0.5,
  `advantage_weights`); equal to the official min(r wA, clip(r) wA) because w > 0.

  Args:
    log_prob, old_log_prob, adv: [B]; clip_eps: eps; omega: weight of positive advantages.

  Returns:
    (loss, rl.losses.PPOStats).
  """
  # Eq. (7): the multi-step improvement objective (the PPO loss) of policy i against its behaviour policy pi^i_k
  # of iteration k; the omega weights come from the official code.
  # official: Lei-Kun/Uni-O4@1eecc45 abppo.py:64-82 (loss)
  return losses.ppo_clip_objective(log_prob, old_log_prob, adv, clip_eps, weights=advantage_weights(adv, omega))


def policy_improvement_loss(params: Any, behaviour_params: Any, obs: jax.Array, key: jax.Array, *,
                            policy: nn.Module, critics: Any, obs_stats: normalization.RunningStats,
                            clip_eps: float, omega: float, obs_clip: float = 10.0) -> tuple[jax.Array, dict]:
  """The offline PPO loss of ONE policy against its behaviour policy on a minibatch of raw states.

  Args:
    params, behaviour_params: current and behaviour policy params (same module).
    obs: [B, D] raw states from the data set.
    key: samples a ~ pi_old(.|s).
    policy: the policy module; critics: anything with `advantage(raw_obs, action) -> [B]` (unio4.Critics).
    obs_stats: input normalisation of the policy.
    clip_eps: PPO clip; omega: asymmetric advantage weight (0.5 = plain).

  Returns:
    (loss, metrics: approx_kl, clip_fraction, ratio_mean, adv_raw_mean, adv_raw_std).
  """
  x = data_lib.normalize_obs(obs_stats, obs, obs_clip)
  old = policy.apply({"params": behaviour_params}, x)
  action = jax.lax.stop_gradient(old.sample(key))  # a ~ pi_old, not clipped (official is_clip_action=False)
  old_log_prob = jax.lax.stop_gradient(old.log_prob(action))
  adv_raw = jax.lax.stop_gradient(critics.advantage(obs, action))
  adv = normalize_advantage(adv_raw)
  log_prob = policy.apply({"params": params}, x).log_prob(action)
  loss, stats = asymmetric_clipped_objective(log_prob, old_log_prob, adv, clip_eps, omega)
  return loss, {"approx_kl": stats.approx_kl, "clip_fraction": stats.clip_fraction, "ratio_mean": stats.ratio_mean,
                "adv_raw_mean": jnp.mean(adv_raw), "adv_raw_std": jnp.std(adv_raw)}


def offline_ppo_loss(params: Any, behaviour_params: Any, obs: jax.Array, key: jax.Array, **kwargs: Any
                     ) -> tuple[jax.Array, dict]:
  """`policy_improvement_loss` of every member (stacked params [K, ...]), summed; member i uses fold_in(key, i).

  Returns:
    (sum_i loss_i, metrics with 'loss' [K] and the per-member stats [K]).
  """
  k = jax.tree.leaves(params)[0].shape[0]
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(k))
  per, m = jax.vmap(lambda p, b, kk: policy_improvement_loss(p, b, obs, kk, **kwargs))(params, behaviour_params, keys)
  return jnp.sum(per), {"loss": per, **m}


def offline_ppo_step(state: TrainState, obs: jax.Array, key: jax.Array, *, policy: nn.Module, critics: Any,
                     obs_stats: normalization.RunningStats, clip_eps: float = 0.25, omega: float = 0.7,
                     obs_clip: float = 10.0) -> tuple[TrainState, dict]:
  """One offline PPO update of all K members.

  Args:
    state: stages.ensemble_state over stacked params [K, ...], extra={'behaviour': stacked behaviour params}.
    obs: [B, D] raw states (one minibatch shared by the members, as in the official joint_train).
    key: the step key (folded with state.step).
    policy, critics, obs_stats, clip_eps, omega, obs_clip: see `policy_improvement_loss`.

  Returns:
    (new state, metrics: 'loss' [K], 'approx_kl' [K], 'clip_fraction' [K], ...).
  """
  k = jax.random.fold_in(key, state.step)
  grads, m = jax.grad(offline_ppo_loss, has_aux=True)(
      state.params, state.extra["behaviour"], obs, k, policy=policy, critics=critics, obs_stats=obs_stats,
      clip_eps=clip_eps, omega=omega, obs_clip=obs_clip)
  return stages.ensemble_apply_gradients(state, grads), m


def replace_if_better(behaviour_params: Any, candidate_params: Any, best_scores: jax.Array,
                      candidate_scores: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
  """The "replace if better" rule, per member: where the candidate's OPE score is strictly higher than the best
  score so far, the behaviour policy becomes the candidate and the best score is updated.

  Args:
    behaviour_params, candidate_params: stacked [K, ...]; best_scores, candidate_scores: [K].

  Returns:
    (new behaviour params, new best scores [K], accepted [K] bool).
  """
  best_scores, candidate_scores = jnp.asarray(best_scores), jnp.asarray(candidate_scores)
  if best_scores.shape != candidate_scores.shape:
    raise ValueError(f"replace_if_better: score shapes differ: {best_scores.shape} vs {candidate_scores.shape}.")
  accept = candidate_scores > best_scores
  pick = lambda b, c: jnp.where(accept.reshape(accept.shape + (1,) * (c.ndim - accept.ndim)), c, b)
  new_best = jnp.where(accept, candidate_scores, best_scores)
  return jax.tree.map(pick, behaviour_params, candidate_params), new_best, accept


def paired_ope_difference(candidate_q_sum: jax.Array, candidate_count: jax.Array, behaviour_q_sum: jax.Array,
                          behaviour_count: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean and standard error over start states of candidate minus behaviour per-state OPE scores.

  Both policies are scored from the same start states with the same model noise (`ope.ope_per_state` with one
  key), so the per-state differences pair them and their spread is the OPE's own noise.

  Args:
    candidate_q_sum, candidate_count, behaviour_q_sum, behaviour_count: [..., B] from `ope.ope_per_state`.

  Returns:
    (mean [...], se [...]) of d_b = q_sum_c / count_c - q_sum_b / count_b over the last axis (ddof = 1).
  """
  d = candidate_q_sum / jnp.maximum(candidate_count, 1.0) - behaviour_q_sum / jnp.maximum(behaviour_count, 1.0)
  n = d.shape[-1]
  if n < 2:
    raise ValueError(f"paired_ope_difference needs >= 2 start states, got {n}.")
  return jnp.mean(d, -1), jnp.std(d, -1, ddof=1) / jnp.sqrt(n)


def replace_if_paired_better(behaviour_params: Any, candidate_params: Any, diff_mean: jax.Array, diff_se: jax.Array,
                             z: float = 2.0) -> tuple[Any, jax.Array]:
  """The paired replacement rule (a flag beside the official "replace if better"): per member, the behaviour
  policy becomes the candidate only when the candidate beats the *current* behaviour policy, both scored on the
  same states and model noise, by more than `z` standard errors of the paired per-state difference.

  Deviation: not in the paper or the official code (they compare the candidate's score with the best score seen
  so far, each from its own draw of states, so a replacement can be accepted on OPE noise alone).

  Args:
    behaviour_params, candidate_params: stacked [K, ...]; diff_mean, diff_se: [K] (`paired_ope_difference`).
    z: standard errors the mean difference must exceed.

  Returns:
    (new behaviour params, accepted [K] bool).
  """
  diff_mean, diff_se = jnp.asarray(diff_mean), jnp.asarray(diff_se)
  if diff_mean.shape != diff_se.shape:
    raise ValueError(f"replace_if_paired_better: shapes differ: {diff_mean.shape} vs {diff_se.shape}.")
  accept = diff_mean > z * diff_se
  pick = lambda b, c: jnp.where(accept.reshape(accept.shape + (1,) * (c.ndim - accept.ndim)), c, b)
  return jax.tree.map(pick, behaviour_params, candidate_params), accept


def select_policy(ope_scores: Sequence[float], eval_returns: Sequence[float] | None = None, top_k: int = 3) -> int:
  """The policy handed to online fine-tuning (official ppo_finetune `load_pi_value`): among the `top_k` members by
  OPE score, the one with the highest (small-budget) evaluation return; by OPE alone when no returns are given.

  Returns:
    member index.
  """
  ope = np.asarray(ope_scores, np.float64)
  order = np.argsort(-ope, kind="stable")[:max(1, int(top_k))]
  if eval_returns is None:
    return int(order[0])
  ret = np.asarray(eval_returns, np.float64)
  if ret.shape != ope.shape:
    raise ValueError(f"select_policy: {ret.shape} eval returns for {ope.shape} OPE scores.")
  return int(order[np.argmax(ret[order])])
