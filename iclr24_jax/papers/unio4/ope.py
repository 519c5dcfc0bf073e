"""Offline policy evaluation (official dynamics_eval.py `rollout`): roll the deterministic policy out in the learned
dynamics ensemble from states of the data set and score it by the mean of Q(s_t, pi(s_t)) over every visited,
not-yet-terminated state. The score only ranks a candidate against the behaviour policy it would replace.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

PolicyFn = Callable[[jax.Array], jax.Array]
QFn = Callable[[jax.Array, jax.Array], jax.Array]


def ope_per_state(key: jax.Array, dynamics: Any, policy: PolicyFn, q: QFn, states: jax.Array,
                  horizon: int) -> tuple[jax.Array, jax.Array]:
  """Per start state: the sum of Q(s_t, pi(s_t)) over its alive imagined states, and how many there were.

  `offline_policy_evaluation` is sum(q_sum) / sum(count) of these. Scoring two policies with the same `key` and
  `states` uses the same start states and the same model noise, so their per-state scores can be compared in
  pairs (the paired replacement rule, `improvement.replace_if_paired_better`).

  Args:
    key: PRNG key (step t of the rollout uses fold_in(key, t)).
    dynamics: anything with `step(key, obs [B, D], action [B, A]) -> (next_obs [B, D], reward [B], terminal [B])`.
    policy: raw states [B, D] -> actions [B, A].
    q: (raw states [B, D], actions [B, A]) -> Q [B].
    states: [B, D] start states.
    horizon: rollout length H >= 1.

  Returns:
    (q_sum [B], count [B]) float32; count >= 1 (the start state is always alive).
  """
  if states.ndim != 2:
    raise ValueError(f"offline_policy_evaluation: states must be [B, D], got {states.shape}.")
  if int(horizon) < 1:
    raise ValueError(f"offline_policy_evaluation: horizon must be >= 1, got {horizon}.")
  b = states.shape[0]

  def body(carry, t):
    s, alive, q_sum, count = carry
    a = policy(s)
    qv = q(s, a)
    q_sum = q_sum + jnp.where(alive, qv, 0.0)
    count = count + alive.astype(jnp.float32)
    s_next, _, term = dynamics.step(jax.random.fold_in(key, t), s, a)
    alive = jnp.logical_and(alive, jnp.logical_not(term))
    s = jnp.where(alive[:, None], s_next, s)
    return (s, alive, q_sum, count), None

  init = (states, jnp.ones((b,), bool), jnp.zeros((b,), jnp.float32), jnp.zeros((b,), jnp.float32))
  # official: Lei-Kun/Uni-O4@1eecc45 dynamics_eval.py:44-75 (rollout)
  (_, _, q_sum, count), _ = jax.lax.scan(body, init, jnp.arange(int(horizon)))
  return q_sum, count


def offline_policy_evaluation(key: jax.Array, dynamics: Any, policy: PolicyFn, q: QFn, states: jax.Array,
                              horizon: int) -> jax.Array:
  """Mean Q along imagined rollouts (the OPE score of Uni-O4).

  score = sum_t sum_b alive_{t,b} Q(s_{t,b}, pi(s_{t,b})) / sum_t sum_b alive_{t,b}, where s_{0,b} = states[b],
  s_{t+1,b} ~ dynamics(s_{t,b}, pi(s_{t,b})), and alive_{t,b} is false once a predicted state was terminal
  (the official loop drops terminated rows and stops when none is left).

  Args:
    key: PRNG key (step t of the rollout uses fold_in(key, t)).
    dynamics: anything with `step(key, obs [B, D], action [B, A]) -> (next_obs [B, D], reward [B], terminal [B])`
      (e.g. unio4.Dynamics).
    policy: raw states [B, D] -> actions [B, A] (deterministic: the mean action, clipped to the action box).
    q: (raw states [B, D], actions [B, A]) -> Q [B].
    states: [B, D] start states (sampled from the data set).
    horizon: rollout length H >= 1.

  Returns:
    scalar score (float32).
  """
  q_sum, count = ope_per_state(key, dynamics, policy, q, states, horizon)
  return jnp.sum(q_sum) / jnp.maximum(jnp.sum(count), 1.0)
