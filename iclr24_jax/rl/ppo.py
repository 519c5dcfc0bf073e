"""PPO for JAX environments, PureJaxRL style: the whole run is one jitted `train(key)`.

  train = make_train(config)                # config: configs/ppo.py (`ppo_defaults()`, `preset`)
  out = jax.jit(train)(jax.random.key(0))   # out['metrics'][k]: [num_updates] curves
  outs = jax.jit(jax.vmap(train))(keys)     # many seeds at once

Building blocks for papers that need more control (fine-tuning from given params, a reward hook, chunked
training with host-side evaluation in between):

  agent = PPO(config, env=None, init_params=None, init_obs_stats=None, reward_fn=None, mesh=None)
  runner = agent.init(key)                  # RunnerState
  runner, metrics = agent.update(runner)    # one rollout + `update_epochs` epochs of minibatch SGD
  runner, metrics = agent.train_chunk(runner, n)   # n updates in a lax.scan

One update: roll out `num_envs` x `rollout_steps` steps with the current policy (observations normalised
with the current running statistics), scale (and optionally clip) the environment reward, pass it through
`reward_fn` (a hook, e.g. an intrinsic reward; see `process_reward`), update the observation statistics,
recompute V(s) and V(s') under them, GAE (exact at time limits, see losses.gae), then `update_epochs` x
`num_minibatches` Adam steps on the clipped PPO loss.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from iclr24_jax.common import optim
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.rl import envs as envs_lib
from iclr24_jax.rl import losses, networks, normalization
from iclr24_jax.rl import rollout as rollout_lib
from iclr24_jax.rl.env_base import Env, EnvState

RewardFn = Callable[[rollout_lib.Transition], jax.Array]


@flax.struct.dataclass
class RunnerState:
  """Everything a PPO run carries between updates.

  Attributes:
    train_state: TrainState (params {'policy', 'value'}, opt_state, step = gradient steps, extra = RunningStats).
    env_state: batched EnvState [num_envs].
    key: the run's key (update u uses fold_in(key, u)).
    update: number of updates done.
  """

  train_state: TrainState
  env_state: EnvState
  key: jax.Array
  update: jax.Array


def _get(cfg: Any, name: str, default: Any) -> Any:
  return cfg.get(name, default) if hasattr(cfg, "get") else getattr(cfg, name, default)


def scale_env_reward(reward: jax.Array, reward_scale: Any = 1.0, reward_clip: Any = 0.0) -> jax.Array:
  """The environment (extrinsic) reward as the learner sees it: clip(reward_scale * r, -reward_clip, reward_clip).

  This is sample-factory's actor-side reward processing (`actor_worker._process_rewards`: scale, then clip),
  which Motif's official runs use; `reward_clip` <= 0 means no clipping (sample-factory's default is 10).

  Args:
    reward: [...] environment rewards.
    reward_scale: multiplies the environment reward only.
    reward_clip: clip bound of the scaled reward; 0 (or None) disables clipping.

  Returns:
    [...] float32 scaled (and clipped) rewards.
  """
  r = jnp.asarray(reward, jnp.float32) * reward_scale
  if reward_clip is not None and reward_clip > 0:  # a Python number (config): static under jit
    r = jnp.clip(r, -reward_clip, reward_clip)
  return r


def process_reward(tr: rollout_lib.Transition, reward_scale: Any = 1.0, reward_clip: Any = 0.0,
                   reward_fn: RewardFn | None = None) -> jax.Array:
  """The rewards that enter GAE: the scaled environment reward, then the reward hook (if any), unscaled.

  The scale applies to the environment reward alone: a hook sees `tr` with `reward` already scaled (and
  clipped) and returns the total reward, so an intrinsic term it adds keeps its own coefficient. This is the
  official Motif formula (sample-factory `actor_worker.py:458-459` scales and clips the game reward;
  `learner.py:792-793` adds the intrinsic term): r = extrinsic_reward * clip(reward_scale * r_env) +
  llm_reward * r_int, with the two coefficients inside the hook. Without a hook the result is
  reward_scale * r_env, as before.

  Args:
    tr: rollout Transition, leaves [T, B, ...]; tr.reward is the raw environment reward.
    reward_scale, reward_clip: see `scale_env_reward`.
    reward_fn: optional hook Transition [T, B] -> rewards [T, B].

  Returns:
    float32 [T, B] rewards for GAE.

  Raises:
    ValueError: the hook returned a shape other than tr.reward's.
  """
  scaled = scale_env_reward(tr.reward, reward_scale, reward_clip)
  if reward_fn is None:
    return scaled
  rewards = reward_fn(tr.replace(reward=scaled))
  if rewards.shape != tr.reward.shape:
    raise ValueError(f"reward_fn returned shape {rewards.shape}; expected {tr.reward.shape} ([T, B]).")
  return jnp.asarray(rewards, jnp.float32)


class PPO:
  """A PPO agent for a JAX `Env` (all methods pure; compile them yourself or use `make_train`).

  Args:
    config: a PPO config (the configs/ppo.py `ppo_defaults()` layout).
    env: an Env (default: `envs.make_env(config.env.name, **config.env.kwargs)`).
    init_params: optional params {'policy': ..., 'value': ...} to start from (fine-tuning); either half may be
      None to keep its fresh initialisation.
    init_obs_stats: optional RunningStats to start from (with init_params trained on normalised inputs).
    reward_fn: optional hook Transition [T, B] -> rewards [T, B] applied before GAE (e.g. an intrinsic reward);
      it sees the environment reward already multiplied by config.ppo.reward_scale and its output is not
      scaled again (see `process_reward`).
    mesh: optional mesh; environments (and the rollout batch) are sharded over its 'data' axis.
  """

  def __init__(self, config: Any, env: Env | None = None, init_params: Any = None,
               init_obs_stats: normalization.RunningStats | None = None, reward_fn: RewardFn | None = None,
               mesh: Mesh | None = None):
    self.config = config
    p = config.ppo
    if env is None:
      kwargs = dict(_get(config.env, "kwargs", {}) or {})
      env = envs_lib.make_env(config.env.name, **kwargs)
    self.env = env
    self.num_envs = int(p.num_envs)
    self.rollout_steps = int(p.rollout_steps)
    self.num_minibatches = int(p.num_minibatches)
    self.update_epochs = int(p.update_epochs)
    self.num_updates = int(config.num_steps)
    batch = self.num_envs * self.rollout_steps
    if batch % self.num_minibatches:
      raise ValueError(f"ppo: num_envs * rollout_steps = {batch} is not divisible by num_minibatches = "
                       f"{self.num_minibatches}; change one of them.")
    if mesh is not None and self.num_envs % mesh.shape["data"]:
      raise ValueError(f"ppo: num_envs = {self.num_envs} is not divisible by the mesh's data axis "
                       f"({mesh.shape['data']} devices).")
    self.minibatch_size = batch // self.num_minibatches
    self.model = networks.make_actor_critic(env.spec.discrete, env.spec.action_dim, config.model)
    self.tx = optim.make_optimizer(config.optimizer, self.num_updates * self.update_epochs * self.num_minibatches)
    self.init_params, self.init_obs_stats = init_params, init_obs_stats
    self.reward_fn, self.mesh = reward_fn, mesh
    self.p = p

  # --- pieces -------------------------------------------------------------------------------------------
  def _constrain(self, tree: Any, axis: int = 0) -> Any:
    if self.mesh is None:
      return tree
    spec = P(*([None] * axis + ["data"]))
    return jax.lax.with_sharding_constraint(tree, NamedSharding(self.mesh, spec))

  def init_params_fn(self, key: jax.Array) -> Any:
    """Fresh params {'policy', 'value'}, with `init_params` halves substituted where given."""
    params = self.model.init(key, jnp.zeros((1,) + self.env.spec.obs_shape, jnp.float32))["params"]
    if self.init_params is not None:
      params = dict(params)
      for half in ("policy", "value"):
        if self.init_params.get(half) is not None:
          given, fresh = self.init_params[half], params[half]
          if jax.tree.structure(given) != jax.tree.structure(fresh):
            raise ValueError(f"ppo: init_params['{half}'] does not match the network built from config.model; "
                             f"expected structure {jax.tree.structure(fresh)}.")
          params[half] = given
    return params

  def init(self, key: jax.Array) -> RunnerState:
    """A fresh RunnerState from a key (split into params / environment / training keys)."""
    key_params, key_env, key_train = jax.random.split(key, 3)
    params = self.init_params_fn(key_params)
    stats = self.init_obs_stats if self.init_obs_stats is not None else normalization.init(self.env.spec.obs_shape)
    ts = TrainState.create(params, self.tx, extra=stats)
    env_state = self._constrain(self.env.reset_batch(key_env, self.num_envs))
    return RunnerState(ts, env_state, key_train, jnp.zeros((), jnp.int32))

  def normalize(self, stats: normalization.RunningStats, obs: jax.Array) -> jax.Array:
    """Observations normalised with `stats` when config.ppo.normalize_obs, else returned unchanged.

    Args:
      stats: RunningStats of the observations.
      obs: [..., *obs_shape] raw observations.

    Returns:
      [..., *obs_shape] (clipped to +-obs_clip when normalised).
    """
    return normalization.normalize(stats, obs, self.p.obs_clip) if self.p.normalize_obs else obs

  def policy_fn(self, params: Any, stats: normalization.RunningStats, deterministic: bool = False):
    """A rollout PolicyFn acting with these params and observation statistics.

    Args:
      params: ActorCritic params.
      stats: observation RunningStats (ignored unless normalize_obs).
      deterministic: act with the distribution's mode.

    Returns:
      policy_fn(key, obs [B, ...]) -> (raw action, env action, {'log_prob': [B], 'value': [B]}).
    """
    return rollout_lib.actor_critic_policy(self.model, params, stats if self.p.normalize_obs else None,
                                           deterministic, self.p.obs_clip)

  def loss_fn(self, params: Any, stats: normalization.RunningStats, batch: dict, key: jax.Array):
    """PPO loss on a flat minibatch dict (obs raw, action, log_prob, value, advantage, return).

    Args:
      params: ActorCritic params (differentiated).
      stats: observation RunningStats.
      batch: minibatch of [N, ...] arrays: obs, action, log_prob, value, advantage, return (optional weight).
      key: PRNG key for the tanh-Gaussian entropy estimate (see `losses.ppo_loss`).

    Returns:
      (scalar loss, metrics dict of scalars), see `losses.ppo_loss`.
    """
    dist, values = self.model.apply({"params": params}, self.normalize(stats, batch["obs"]))
    p = self.p
    return losses.ppo_loss(dist, values, batch, clip_eps=p.clip_eps, vf_coef=p.vf_coef, ent_coef=p.ent_coef,
                           value_clip_eps=p.value_clip_eps or None, normalize_adv=p.normalize_advantages,
                           weights=batch.get("weight"), key=key)

  def advantages(self, params: Any, stats: normalization.RunningStats,
                 tr: rollout_lib.Transition) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(rewards, values, advantages, returns) [T, B] for a trajectory under the given params and statistics.

    The environment reward is multiplied by config.ppo.reward_scale (and clipped to +-ppo.reward_clip when
    that is > 0), then passes through reward_fn when given (`process_reward`).

    Args:
      params: ActorCritic params.
      stats: observation RunningStats.
      tr: rollout Transition with leaves [T, B, ...].

    Returns:
      (rewards, values, advantages, returns), each float32 [T, B].
    """
    rewards = process_reward(tr, self.p.reward_scale, _get(self.p, "reward_clip", 0.0), self.reward_fn)
    v_apply = lambda o: self.model.apply({"params": params}, self.normalize(stats, o), method="v")
    values = v_apply(tr.obs)
    next_values = v_apply(tr.next_obs)
    adv, ret = losses.gae(rewards, values, next_values, tr.terminated, tr.done, self.p.gamma, self.p.gae_lambda)
    return rewards, values, adv, ret

  # --- one update ----------------------------------------------------------------------------------------
  def update(self, runner: RunnerState) -> tuple[RunnerState, dict]:
    """One PPO iteration: rollout, GAE, `update_epochs` epochs of minibatch SGD.

    Returns:
      (new RunnerState, metrics dict of scalars).
    """
    runner, metrics, _ = self._update(runner)
    return runner, metrics

  def update_with_trajectory(self, runner: RunnerState) -> tuple[RunnerState, dict, rollout_lib.Transition]:
    """Like `update`, also returning the rollout (Transition [T, B]) it trained on."""
    return self._update(runner)

  def _update(self, runner: RunnerState):
    ts = runner.train_state
    key = jax.random.fold_in(runner.key, runner.update)
    k_roll, k_perm, k_loss = jax.random.split(key, 3)
    env_state, tr = rollout_lib.rollout(self.env, self.policy_fn(ts.params, ts.extra), runner.env_state, k_roll,
                                        self.rollout_steps)
    env_state = self._constrain(env_state)
    tr = self._constrain(tr, axis=1)
    stats = normalization.update(ts.extra, tr.obs) if self.p.normalize_obs else ts.extra
    rewards, values, adv, ret = self.advantages(ts.params, stats, tr)
    n = self.num_envs * self.rollout_steps
    flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]),
                        {"obs": tr.obs, "action": tr.action, "log_prob": tr.extras["log_prob"], "value": values,
                         "advantage": adv, "return": ret})

    def epoch(ts, e):
      perm = jax.random.permutation(jax.random.fold_in(k_perm, e), n)
      mbs = jax.tree.map(lambda x: x[perm].reshape((self.num_minibatches, self.minibatch_size) + x.shape[1:]), flat)

      def minibatch(ts, mb):
        k = jax.random.fold_in(k_loss, ts.step)
        grads, m = jax.grad(self.loss_fn, has_aux=True)(ts.params, stats, mb, k)
        return ts.apply_gradients(grads), m

      return jax.lax.scan(minibatch, ts, mbs)

    ts, m = jax.lax.scan(epoch, ts, jnp.arange(self.update_epochs))
    ts = ts.replace(extra=stats)
    m = jax.tree.map(jnp.mean, m)
    done = tr.done.astype(jnp.float32)
    n_done = jnp.sum(done)
    started = env_state.episodes > 0
    m.update({
        "episode_return": jnp.sum(tr.episode_return * done) / jnp.maximum(n_done, 1.0),  # finished in this rollout
        "last_episode_return": jnp.sum(env_state.last_return * started) / jnp.maximum(jnp.sum(started), 1.0),
        "episodes": n_done,
        "reward": jnp.mean(rewards),
        "env_steps": (runner.update + 1).astype(jnp.float32) * n,
    })
    return RunnerState(ts, env_state, runner.key, runner.update + 1), m, tr

  def train_chunk(self, runner: RunnerState, num_updates: int) -> tuple[RunnerState, dict]:
    """`num_updates` updates in one lax.scan -> (RunnerState, metrics of [num_updates]).

    Args:
      runner: the current RunnerState.
      num_updates: updates to run (static).

    Returns:
      (new RunnerState, metrics dict with leaves [num_updates]).
    """
    return jax.lax.scan(lambda r, _: self.update(r), runner, None, length=num_updates)

  def train(self, key: jax.Array) -> dict:
    """The whole run: init + `config.num_steps` updates -> {'runner_state', 'metrics' ([num_updates] each)}."""
    runner = self.init(key)
    runner, metrics = self.train_chunk(runner, self.num_updates)
    return {"runner_state": runner, "metrics": metrics}

  def evaluate(self, params: Any, stats: normalization.RunningStats, key: jax.Array, num_envs: int = 16,
               deterministic: bool = True) -> dict:
    """Mean return of `num_envs` episodes with the (deterministic by default) policy.

    Args:
      params: ActorCritic params.
      stats: observation RunningStats.
      key: PRNG key.
      num_envs: episodes (one per environment).
      deterministic: act with the distribution's mode.

    Returns:
      the `rollout.evaluate` dict: 'return' (mean of each env's first episode), 'return_std', 'length',
      'returns' [num_envs].
    """
    return rollout_lib.evaluate(self.env, self.policy_fn(params, stats, deterministic), key, num_envs)


def make_train(config: Any, env: Env | None = None, init_params: Any = None,
               init_obs_stats: normalization.RunningStats | None = None, reward_fn: RewardFn | None = None,
               mesh: Mesh | None = None) -> Callable[[jax.Array], dict]:
  """PureJaxRL-style entry point: returns a pure `train(key) -> {'runner_state', 'metrics'}`.

  Args:
    config: a PPO config (configs/ppo.py layout); num_steps = PPO updates.
    env, init_params, init_obs_stats, reward_fn, mesh: see `PPO`.

  Returns:
    train(key): pure; jit it, vmap it over keys for many seeds.
  """
  return PPO(config, env, init_params, init_obs_stats, reward_fn, mesh).train
