"""PPO with a host-side environment loop (NetHack, gymnasium), discrete actions, and a reward hook.

The environment steps on the host (Python/C); acting and learning are jitted JAX functions:

  agent = HostPPO(config, env, model, reward_hook=None)
  state = agent.init(jax.random.key(0))
  state, history = agent.train(state, num_updates, key)       # or, round by round (u = 0, 1, ...):
  state, metrics = agent.update(state, u, key)                  # collect + learn with fold_in(key, u)
  saved = agent.env_state(); agent.restore_env(saved)           # the games mid-episode, for a checkpoint
  # or, step by step:
  batch = agent.collect(state, key)                             # host loop, [T, N] arrays
  state, metrics = agent.learn(state, batch, key)               # hook -> GAE -> epochs of minibatch SGD

`env` is any vectorised host environment with `reset() -> obs` and `step(actions [N]) -> (obs, reward,
terminated, truncated, info)` where obs is an array or a dict of arrays with leading axis N and
`info['final_obs']` holds pre-reset observations (NetHackVecEnv; `GymnasiumVecEnv` wraps gymnasium ids).
`model` is a Flax module obs -> (Categorical, value [N]).

The reward hook (for an intrinsic reward such as Motif's) sees the whole collected batch (numpy):
  reward_hook(batch) -> rewards [T, N], batch keys: obs, next_obs (pre-reset), action, reward (the extrinsic
  reward already scaled by ppo.reward_scale and clipped to +-ppo.reward_clip when > 0), terminated, truncated
  (all [T, N, ...]).
Its output replaces the reward before GAE and is not scaled again, so an intrinsic term keeps its own
coefficient (the official Motif formula, see `ppo.process_reward`); the raw extrinsic reward stays in the metrics.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import optim
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.rl import losses
from iclr24_jax.rl.ppo import scale_env_reward

RewardHook = Callable[[dict], np.ndarray]


class GymnasiumVecEnv:
  """A gymnasium id run as N copies with SAME_STEP auto-reset, in the NetHackVecEnv interface.

  Args:
    env_id: e.g. 'CartPole-v1'. num_envs: copies. seed: game i is reset with seed + i at the first reset.
  """

  def __init__(self, env_id: str, num_envs: int = 4, seed: int = 0, **kwargs: Any):
    import gymnasium as gym
    self.venv = gym.vector.SyncVectorEnv([lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)],
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    self.num_envs, self.seed = num_envs, seed
    self.num_actions = int(self.venv.single_action_space.n)
    self._first = True
    self.episode_return = np.zeros(num_envs)
    self.episode_length = np.zeros(num_envs, np.int64)

  def reset(self, seed: int | None = None):
    """Resets every game; returns obs [N, *obs_shape] float32.

    Game i gets seed + i on the first reset (or when `seed` is given); later resets continue the games' streams.

    Args:
      seed: optional base seed overriding the constructor's.

    Returns:
      numpy float32 [N, *obs_shape].
    """
    s = self.seed if seed is None else seed
    obs, _ = self.venv.reset(seed=[s + i for i in range(self.num_envs)] if (self._first or seed is not None)
                             else None)
    self._first = False
    self.episode_return[:] = 0
    self.episode_length[:] = 0
    return np.asarray(obs, np.float32)

  def step(self, actions):
    """Steps all N games (same-step auto-reset) with actions [N].

    Args:
      actions: [N] int actions.

    Returns:
      (obs [N, ...] float32 (the reset observation where a game ended), reward [N] float32, terminated [N] bool,
      truncated [N] bool, info dict with final_obs [N, ...] (pre-reset), episode_return [N] and episode_length
      [N] (non-zero only where a game ended)).
    """
    obs, r, term, trunc, info = self.venv.step(np.asarray(actions))
    obs = np.asarray(obs, np.float32)
    done = np.asarray(term) | np.asarray(trunc)
    final = obs.copy()
    if done.any() and "final_obs" in info:
      for i in np.flatnonzero(done):
        final[i] = info["final_obs"][i]
    self.episode_return += r
    self.episode_length += 1
    info = dict(info, final_obs=final, episode_return=np.where(done, self.episode_return, 0.0),
                episode_length=np.where(done, self.episode_length, 0))
    self.episode_return[done] = 0
    self.episode_length[done] = 0
    return obs, np.asarray(r, np.float32), np.asarray(term, bool), np.asarray(trunc, bool), info

  def close(self):
    """Closes the underlying gymnasium vector environment."""
    self.venv.close()


def _tree_stack(items: list) -> Any:
  return jax.tree.map(lambda *xs: np.stack(xs), *items)


class HostPPO:
  """PPO for host environments with discrete actions (see module docstring).

  Args:
    config: a PPO config (the configs/ppo.py `ppo_defaults()` layout): ppo.{rollout_steps, update_epochs,
      num_minibatches, gamma, gae_lambda, clip_eps, value_clip_eps, ent_coef, vf_coef, normalize_advantages,
      reward_scale, reward_clip (optional, 0 = none)}, optimizer, num_steps (= updates, for the learning-rate
      schedule).
      ppo.num_envs is taken from `env`.
    env: the vectorised host environment.
    model: Flax module obs -> (Categorical, value).
    reward_hook: optional batch -> rewards [T, N] (numpy), applied before GAE to the batch whose 'reward' is
      the scaled environment reward (see `rewards`).
  """

  def __init__(self, config: Any, env: Any, model: Any, reward_hook: RewardHook | None = None):
    self.config, self.env, self.model, self.reward_hook = config, env, model, reward_hook
    p = config.ppo
    self.p = p
    self.num_envs = int(env.num_envs)
    self.rollout_steps = int(p.rollout_steps)
    n = self.num_envs * self.rollout_steps
    if n % int(p.num_minibatches):
      raise ValueError(f"host ppo: num_envs * rollout_steps = {n} is not divisible by num_minibatches "
                       f"= {p.num_minibatches}.")
    self.minibatch_size = n // int(p.num_minibatches)
    self.tx = optim.make_optimizer(config.optimizer, int(config.num_steps) * int(p.update_epochs)
                                   * int(p.num_minibatches))
    self._act = jax.jit(self._act_fn)
    self._value = jax.jit(lambda params, obs: self.model.apply({"params": params}, obs)[1])
    self._learn = jax.jit(self._learn_fn)
    self._obs = None

  def init(self, key: jax.Array) -> TrainState:
    """Params from a first observation of the environment (resets it)."""
    self._obs = self.env.reset()
    example = jax.tree.map(lambda x: jnp.asarray(x[:1]), self._obs)
    params = self.model.init(key, example)["params"]
    return TrainState.create(params, self.tx)

  def _act_fn(self, params, obs, key):
    dist, value = self.model.apply({"params": params}, obs)
    a = dist.sample(key)
    return a, dist.log_prob(a), value

  def collect(self, state: TrainState, key: jax.Array) -> dict:
    """Steps the host environments `rollout_steps` times with the current policy.

    Args:
      state: TrainState of the ActorCritic.
      key: PRNG key (step t uses fold_in(key, t)).

    Returns:
      batch dict of numpy arrays [T, N, ...]: obs, next_obs, action, log_prob, value, next_value (V of the
      pre-reset next observation), reward, terminated, truncated, episode_return, episode_length.
    """
    if self._obs is None:
      self._obs = self.env.reset()
    rows = []
    for t in range(self.rollout_steps):
      obs = self._obs
      a, logp, v = jax.device_get(self._act(state.params, obs, jax.random.fold_in(key, t)))
      nobs, r, term, trunc, info = self.env.step(a)
      rows.append(dict(obs=obs, next_obs=info["final_obs"], action=a, log_prob=logp, value=v, reward=r,
                       terminated=term, truncated=trunc, episode_return=info["episode_return"],
                       episode_length=info["episode_length"]))
      self._obs = nobs
    batch = _tree_stack(rows)
    # V(s'_t): the next row's value inside an episode; a fresh forward pass on pre-reset observations at ends.
    last_v = np.asarray(jax.device_get(self._value(state.params, self._obs)))
    next_v = np.concatenate([batch["value"][1:], last_v[None]], axis=0)
    done = batch["terminated"] | batch["truncated"]
    for t in np.flatnonzero(done.any(axis=1)):  # whole [N] rows, so the value function compiles once
      final = jax.tree.map(lambda x: x[t], batch["next_obs"])
      v_final = np.asarray(jax.device_get(self._value(state.params, final)))
      next_v[t] = np.where(done[t], v_final, next_v[t])
    batch["next_value"] = next_v.astype(np.float32)
    return batch

  def _learn_fn(self, state: TrainState, batch: dict, rewards: jax.Array, key: jax.Array):
    p = self.p
    done = jnp.logical_or(batch["terminated"], batch["truncated"])
    adv, ret = losses.gae(rewards, batch["value"], batch["next_value"], batch["terminated"], done, p.gamma,
                          p.gae_lambda)
    n = self.num_envs * self.rollout_steps
    flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]),
                        {"obs": batch["obs"], "action": batch["action"], "log_prob": batch["log_prob"],
                         "value": batch["value"], "advantage": adv, "return": ret})

    def loss_fn(params, mb, k):
      dist, values = self.model.apply({"params": params}, mb["obs"])
      return losses.ppo_loss(dist, values, mb, clip_eps=p.clip_eps, vf_coef=p.vf_coef, ent_coef=p.ent_coef,
                             value_clip_eps=p.value_clip_eps or None, normalize_adv=p.normalize_advantages, key=k)

    def epoch(ts, e):
      perm = jax.random.permutation(jax.random.fold_in(key, e), n)
      mbs = jax.tree.map(lambda x: x[perm].reshape((int(p.num_minibatches), self.minibatch_size) + x.shape[1:]),
                         flat)

      def minibatch(ts, mb):
        grads, m = jax.grad(loss_fn, has_aux=True)(ts.params, mb, jax.random.fold_in(key, ts.step))
        return ts.apply_gradients(grads), m

      return jax.lax.scan(minibatch, ts, mbs)

    state, m = jax.lax.scan(epoch, state, jnp.arange(int(p.update_epochs)))
    return state, jax.tree.map(jnp.mean, m)

  def rewards(self, batch: dict) -> np.ndarray:
    """The rewards that enter GAE: reward_scale * r_env (clipped to +-reward_clip when > 0), then the hook.

    The hook sees the batch with 'reward' replaced by the scaled environment reward and its output is used as
    is (sample-factory scales the game reward on the actor, Motif's learner adds the intrinsic term after).

    Args:
      batch: `collect` output ([T, N, ...] arrays; 'reward' is the raw environment reward).

    Returns:
      float32 [T, N] rewards.

    Raises:
      ValueError: the reward hook returned a shape other than [T, N].
    """
    scaled = np.asarray(scale_env_reward(batch["reward"], float(self.p.reward_scale),
                                         float(self.p.get("reward_clip", 0.0) or 0.0)), np.float32)
    if self.reward_hook is None:
      return scaled
    rewards = np.asarray(self.reward_hook(dict(batch, reward=scaled)), np.float32)
    if rewards.shape != batch["reward"].shape:
      raise ValueError(f"reward_hook returned shape {rewards.shape}; expected {batch['reward'].shape} ([T, N]).")
    return rewards

  def learn(self, state: TrainState, batch: dict, key: jax.Array) -> tuple[TrainState, dict]:
    """Applies the reward scale and hook (`rewards`), then one PPO update on a collected batch.

    Args:
      state: TrainState of the ActorCritic.
      batch: `collect` output ([T, N, ...] arrays).
      key: PRNG key of the minibatch permutations and losses.

    Returns:
      (new TrainState, metrics dict of floats incl. extrinsic_reward (raw), hook_reward (what GAE saw),
      episodes, episode_return).

    Raises:
      ValueError: the reward hook returned a shape other than [T, N].
    """
    rewards = self.rewards(batch)
    jb = {k: batch[k] for k in ("obs", "action", "log_prob", "value", "next_value", "terminated", "truncated")}
    state, m = self._learn(state, jb, jnp.asarray(rewards), key)
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    done = batch["terminated"] | batch["truncated"]
    m["extrinsic_reward"] = float(np.mean(batch["reward"]))
    m["hook_reward"] = float(np.mean(rewards))
    m["episodes"] = int(done.sum())
    m["episode_return"] = float(batch["episode_return"][done].mean()) if done.any() else float("nan")
    return state, m

  def update(self, state: TrainState, u: int, key: jax.Array) -> tuple[TrainState, dict]:
    """Round `u` of collect + learn with the keys of `fold_in(key, u)`, so a run resumed at round u draws what an
    uninterrupted one does.

    Args:
      state: TrainState of the ActorCritic.
      u: the round's index (0-based).
      key: the run's PRNG key.

    Returns:
      (new TrainState, the `learn` metrics with 'update' (u + 1) and 'env_steps' (after the round) added).
    """
    k_collect, k_learn = jax.random.split(jax.random.fold_in(key, u))
    batch = self.collect(state, k_collect)
    state, m = self.learn(state, batch, k_learn)
    m["update"] = u + 1
    m["env_steps"] = (u + 1) * self.num_envs * self.rollout_steps
    return state, m

  def env_state(self) -> dict:
    """The environments' state for a checkpoint (`env.get_state()`, JSON-safe; NetHackVecEnv has it).

    Raises:
      TypeError: the environment cannot save its state.
    """
    if not hasattr(self.env, "get_state"):
      raise TypeError(f"{type(self.env).__name__} has no get_state / set_state: its episodes cannot be resumed.")
    return self.env.get_state()

  def restore_env(self, saved: dict) -> None:
    """Puts the environments back where `env_state` saw them (`env.set_state`); the next `collect` continues
    those episodes.

    Args:
      saved: an `env_state` dict.
    """
    if not hasattr(self.env, "set_state"):
      raise TypeError(f"{type(self.env).__name__} has no get_state / set_state: its episodes cannot be resumed.")
    self._obs = self.env.set_state(saved)

  def train(self, state: TrainState, num_updates: int, key: jax.Array,
            log_fn: Callable[[int, dict], None] | None = None) -> tuple[TrainState, list[dict]]:
    """`num_updates` rounds of collect + learn; update u uses fold_in(key, u). Returns (state, metric rows).

    Args:
      state: TrainState of the ActorCritic.
      num_updates: rounds of collect + learn.
      key: PRNG key.
      log_fn: optional callback log_fn(update (1-based), metrics) after each round.

    Returns:
      (final TrainState, list of metric dicts with 'update' and 'env_steps' added).
    """
    history = []
    for u in range(num_updates):
      state, m = self.update(state, u, key)
      history.append(m)
      if log_fn is not None:
        log_fn(u + 1, m)
    return state, history
