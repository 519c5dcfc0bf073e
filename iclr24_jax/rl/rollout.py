"""Rollouts of JAX environments with `lax.scan`, and policy evaluation.

A policy here is any pure function `policy_fn(key, obs [B, *obs_shape]) -> (raw_action, env_action, extras)`
where `extras` is a dict of per-step arrays to keep (log-prob, value ...). `actor_critic_policy` builds one
from an ActorCritic and its params.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from iclr24_jax.rl import normalization
from iclr24_jax.rl.env_base import Env, EnvState

PolicyFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, dict]]


@flax.struct.dataclass
class Transition:
  """One step of a batch of environments; stacked by `rollout` to [T, B, ...].

  Attributes:
    obs: s_t (raw, un-normalised).
    action: the raw action (pre-squash for tanh policies; what log_prob refers to).
    env_action: the action the environment received.
    reward, terminated, truncated: from the TimeStep.
    next_obs: s'_t before any auto-reset (D4RL's next_observations).
    episode_return, episode_length: of the episode that ended at t (0 elsewhere).
    extras: dict from the policy (e.g. 'log_prob', 'value').
  """

  obs: jax.Array
  action: jax.Array
  env_action: jax.Array
  reward: jax.Array
  terminated: jax.Array
  truncated: jax.Array
  next_obs: jax.Array
  episode_return: jax.Array
  episode_length: jax.Array
  extras: Any

  @property
  def done(self) -> jax.Array:
    return jnp.logical_or(self.terminated, self.truncated)


def rollout(env: Env, policy_fn: PolicyFn, env_state: EnvState, key: jax.Array,
            num_steps: int) -> tuple[EnvState, Transition]:
  """Runs `num_steps` steps of a batch of environments in one `lax.scan`.

  Args:
    env: the environment.
    policy_fn: (key, obs [B, ...]) -> (raw_action [B, ...], env_action [B, ...], extras dict of [B, ...]).
    env_state: batched EnvState [B].
    key: the rollout key (step t uses fold_in(key, t)).
    num_steps: T.

  Returns:
    (final EnvState, Transition with leaves [T, B, ...]).
  """

  def body(state, t):
    k = jax.random.fold_in(key, t)
    k_act, k_env = jax.random.split(k)
    raw, env_action, extras = policy_fn(k_act, state.obs)
    new_state, ts = env.step_batch(k_env, state, env_action)
    tr = Transition(obs=state.obs, action=raw, env_action=env_action, reward=ts.reward, terminated=ts.terminated,
                    truncated=ts.truncated, next_obs=ts.final_obs, episode_return=ts.episode_return,
                    episode_length=ts.episode_length, extras=extras)
    return new_state, tr

  return jax.lax.scan(body, env_state, jnp.arange(num_steps))


def actor_critic_policy(model, params: Any, obs_stats: normalization.RunningStats | None = None,
                        deterministic: bool = False, obs_clip: float = 10.0) -> PolicyFn:
  """A PolicyFn from an ActorCritic (networks.ActorCritic) and params {'policy', 'value'}.

  Extras: 'log_prob' and 'value' of the sampled raw action.

  Args:
    model: the ActorCritic module; model.apply({'params': params}, obs) -> (distribution, value [B]).
    params: its parameters.
    obs_stats: optional RunningStats; observations are normalised with them first.
    deterministic: take the distribution's mode instead of sampling.
    obs_clip: clip bound of the observation normalisation.

  Returns:
    policy_fn(key, obs [B, ...]) -> (raw action [B, ...], env action [B, ...], {'log_prob': [B], 'value': [B]}).
  """

  def policy_fn(key, obs):
    x = obs if obs_stats is None else normalization.normalize(obs_stats, obs, obs_clip)
    dist, value = model.apply({"params": params}, x)
    raw = dist.mode() if deterministic else dist.sample(key)
    return raw, dist.to_env(raw), {"log_prob": dist.log_prob(raw), "value": value}

  return policy_fn


def random_policy(env: Env) -> PolicyFn:
  """Uniform random actions (discrete: uniform index; continuous: uniform in [low, high]^A)."""
  spec = env.spec

  def policy_fn(key, obs):
    b = obs.shape[0]
    if spec.discrete:
      a = jax.random.randint(key, (b,), 0, spec.action_dim)
    else:
      a = jax.random.uniform(key, (b, spec.action_dim), minval=spec.action_low, maxval=spec.action_high)
    return a, a, {}

  return policy_fn


def evaluate(env: Env, policy_fn: PolicyFn, key: jax.Array, num_envs: int = 16,
             num_steps: int | None = None) -> dict[str, jax.Array]:
  """Mean return of the first finished episode of each of `num_envs` environments.

  Runs `num_steps` (default: the env's time limit, so every episode finishes) steps; an environment whose
  first episode has not finished counts its partial return.

  Args:
    env: the environment; policy_fn: as in `rollout`; key: PRNG key; num_envs: parallel episodes.

  Returns:
    dict with 'return' (mean), 'return_std', 'length' (mean), 'returns' [num_envs].
  """
  num_steps = num_steps or env.spec.max_episode_steps
  k_reset, k_roll = jax.random.split(key)
  state = env.reset_batch(k_reset, num_envs)
  _, tr = rollout(env, policy_fn, state, k_roll, num_steps)
  done = tr.done
  first = jnp.logical_and(done, jnp.cumsum(done, axis=0) == 1)
  finished = jnp.any(done, axis=0)
  ret_first = jnp.sum(jnp.where(first, tr.episode_return, 0.0), axis=0)
  len_first = jnp.sum(jnp.where(first, tr.episode_length, 0), axis=0)
  returns = jnp.where(finished, ret_first, jnp.sum(tr.reward, axis=0))
  lengths = jnp.where(finished, len_first, num_steps)
  return {"return": jnp.mean(returns), "return_std": jnp.std(returns), "length": jnp.mean(lengths.astype(jnp.float32)),
          "returns": returns}
