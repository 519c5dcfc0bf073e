"""One small interface for JAX environments: brax, gymnax and the point-mass maze behind `Env`.

An adapter implements two pure single-environment functions:

  reset_core(key) -> (core_state, obs)
  step_core(key, core_state, action) -> (core_state, obs, reward, terminated)

and `Env` adds what every algorithm needs on top, the same for all of them: a time limit (truncation),
automatic reset, the observation *before* the reset (`final_obs`, for bootstrapping and for
`next_observations` in offline data), and episode statistics (return and length of the last finished
episode), in the style of PureJaxRL's LogWrapper:

  state = env.reset(key)                                # EnvState, one environment
  state, ts = env.step(key, state, action)              # ts: TimeStep
  states = env.reset_batch(key, num_envs)               # vmapped
  states, ts = env.step_batch(key, states, actions)     # [num_envs, ...]

Everything is pure and jit/vmap/scan-able; an `Env` object is static (closed over, never traced).

brax backends (brax 0.14.2, measured on this 2-core CPU, 64 envs x 100 random steps in one `lax.scan`;
see README.md): spring is the fastest on CPU for both inverted_pendulum (~310k steps/s vs positional 113k,
mjx 79k, generalized 66k) and hopper (~92k vs positional 40k, mjx 14k, generalized 13k), so `spring` is
the default here (`BRAX_DEFAULT_BACKEND`); pass `backend='generalized'` for the most faithful contacts.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

# Fastest brax backend on CPU per environment, measured here (see module docstring / README.md).
BRAX_DEFAULT_BACKEND = {"inverted_pendulum": "spring", "inverted_double_pendulum": "spring", "hopper": "spring",
                        "halfcheetah": "spring", "ant": "spring", "walker2d": "spring", "reacher": "spring"}
BRAX_ENVS = ("ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_pendulum",
             "inverted_double_pendulum", "pusher", "reacher", "swimmer", "walker2d")


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """Static description of an environment.

  Attributes:
    name: e.g. 'gymnax/CartPole-v1', 'brax/hopper', 'maze/umaze'.
    obs_shape: shape of one observation.
    discrete: True for integer actions in [0, num_actions).
    action_dim: number of discrete actions, or continuous action dimensions.
    action_low, action_high: bounds of continuous actions (the policy's squash maps into them).
    max_episode_steps: time limit; reaching it truncates (not terminates) the episode.
  """

  name: str
  obs_shape: tuple[int, ...]
  discrete: bool
  action_dim: int
  action_low: float = -1.0
  action_high: float = 1.0
  max_episode_steps: int = 1000


@flax.struct.dataclass
class EnvState:
  """State of one (or, batched, many) environments.

  Attributes:
    core: the adapter's own state.
    obs: the current observation [*obs_shape].
    step_count: steps in the current episode.
    episode_return, episode_length: running totals of the current episode.
    last_return, last_length: those of the last finished episode (0 before the first).
    episodes: finished episodes so far.
    first_core, first_obs: the state each episode restarts from when the env's reset_mode is 'cached' (brax's
      AutoResetWrapper behaviour); None when 'fresh'.
  """

  core: Any
  obs: jax.Array
  step_count: jax.Array
  episode_return: jax.Array
  episode_length: jax.Array
  last_return: jax.Array
  last_length: jax.Array
  episodes: jax.Array
  first_core: Any = None
  first_obs: Any = None


@flax.struct.dataclass
class TimeStep:
  """What one step returns.

  Attributes:
    obs: the next observation; after an episode end, the first observation of the next episode.
    reward: r_t.
    terminated: the episode ended in a terminal state (no bootstrapping).
    truncated: the episode was cut by the time limit (bootstrap from final_obs).
    final_obs: the observation reached by this step before any reset (= obs when not done).
    episode_return, episode_length: totals of the episode that ended here (0 when not done).
  """

  obs: jax.Array
  reward: jax.Array
  terminated: jax.Array
  truncated: jax.Array
  final_obs: jax.Array
  episode_return: jax.Array
  episode_length: jax.Array

  @property
  def done(self) -> jax.Array:
    return jnp.logical_or(self.terminated, self.truncated)


def _strong(tree: Any) -> Any:
  """Leaves as arrays with an explicit (non-weak) dtype, so scan carries keep one type."""
  return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), tree)


def _select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
  def sel(a, b):
    a, b = jnp.asarray(a), jnp.asarray(b)
    return jnp.where(jnp.reshape(pred, pred.shape + (1,) * (b.ndim - pred.ndim)), a, b).astype(b.dtype)
  return jax.tree.map(sel, on_true, on_false)


class Env:
  """Base class: subclasses set `self.spec` and implement `reset_core` / `step_core`.

  `reset_mode`: 'fresh' draws a new initial state at every auto-reset (exact; the reset is computed every
  step and selected where done); 'cached' restarts each environment from its own first initial state, as
  brax's AutoResetWrapper does (cheaper: no brax reset computed inside every step; measured on CPU for
  inverted_pendulum ~1.2x the rollout speed and ~0.8x the compile time of 'fresh').
  """

  spec: EnvSpec
  reset_mode: str = "fresh"

  def reset_core(self, key: jax.Array) -> tuple[Any, jax.Array]:
    raise NotImplementedError

  def step_core(self, key: jax.Array, core: Any, action: jax.Array) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
    raise NotImplementedError

  # --- the shared layer -------------------------------------------------------------------------------------
  def reset(self, key: jax.Array) -> EnvState:
    """Starts one environment.

    Args:
      key: a typed PRNG key.

    Returns:
      EnvState with obs [*obs_shape].
    """
    core, obs = self.reset_core(key)
    core = _strong(core)
    obs = obs.astype(jnp.float32)
    z_f, z_i = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
    if self.reset_mode == "cached":
      return EnvState(core, obs, z_i, z_f, z_i, z_f, z_i, z_i, first_core=core, first_obs=obs)
    if self.reset_mode != "fresh":
      raise ValueError(f"unknown reset_mode '{self.reset_mode}'; choose 'fresh' or 'cached'.")
    return EnvState(core, obs, z_i, z_f, z_i, z_f, z_i, z_i)

  def step(self, key: jax.Array, state: EnvState, action: jax.Array) -> tuple[EnvState, TimeStep]:
    """One step of one environment with time limit, auto-reset and episode statistics.

    Args:
      key: a typed PRNG key (split into step and reset keys).
      state: EnvState.
      action: [] int for discrete envs, [action_dim] float in [action_low, action_high] otherwise.

    Returns:
      (next EnvState, TimeStep).
    """
    key_step, key_reset = jax.random.split(key)
    core, obs, reward, terminated = self.step_core(key_step, state.core, action)
    core = jax.tree.map(lambda new, old: jnp.asarray(new, jnp.asarray(old).dtype), core, state.core)
    obs = obs.astype(jnp.float32)
    reward = jnp.asarray(reward, jnp.float32)
    terminated = jnp.asarray(terminated, bool)
    step_count = state.step_count + 1
    truncated = jnp.logical_and(step_count >= self.spec.max_episode_steps, jnp.logical_not(terminated))
    done = jnp.logical_or(terminated, truncated)
    ep_ret = state.episode_return + reward
    ep_len = state.episode_length + 1
    if state.first_core is not None:
      reset_core, reset_obs = state.first_core, state.first_obs
    else:
      reset_core, reset_obs = self.reset_core(key_reset)
    core = _select(done, reset_core, core)
    next_obs = jnp.where(done, reset_obs.astype(jnp.float32), obs)
    new_state = EnvState(
        core=core, obs=next_obs, step_count=jnp.where(done, 0, step_count),
        episode_return=jnp.where(done, 0.0, ep_ret), episode_length=jnp.where(done, 0, ep_len),
        last_return=jnp.where(done, ep_ret, state.last_return), last_length=jnp.where(done, ep_len, state.last_length),
        episodes=state.episodes + done.astype(jnp.int32), first_core=state.first_core, first_obs=state.first_obs)
    ts = TimeStep(obs=next_obs, reward=reward, terminated=terminated, truncated=truncated, final_obs=obs,
                  episode_return=jnp.where(done, ep_ret, 0.0), episode_length=jnp.where(done, ep_len, 0))
    return new_state, ts

  def reset_batch(self, key: jax.Array, num_envs: int) -> EnvState:
    """`num_envs` independent resets -> EnvState with leading axis [num_envs]."""
    return jax.vmap(self.reset)(jax.random.split(key, num_envs))

  def step_batch(self, key: jax.Array, state: EnvState, action: jax.Array) -> tuple[EnvState, TimeStep]:
    """Steps a batch of environments [num_envs, ...] with independent keys."""
    n = state.step_count.shape[0]
    return jax.vmap(self.step)(jax.random.split(key, n), state, action)

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.spec.name})"


class GymnaxEnv(Env):
  """A gymnax environment (natural termination from `step_env`; the time limit from its params).

  Args:
    name: gymnax id, e.g. 'CartPole-v1', 'Acrobot-v1', 'Pendulum-v1'.
    max_episode_steps: overrides the env params' `max_steps_in_episode`.
    **params: overrides of the gymnax EnvParams fields.
  """

  def __init__(self, name: str, max_episode_steps: int | None = None, **params: Any):
    import gymnax
    try:
      self.env, default = gymnax.make(name)
    except Exception as e:  # gymnax raises a bare ValueError listing nothing
      raise ValueError(f"unknown gymnax environment '{name}' ({e}); see gymnax.registered_envs.") from e
    self.params = default.replace(**params) if params else default
    limit = max_episode_steps or int(getattr(self.params, "max_steps_in_episode", 1000))
    space = self.env.action_space(self.params)
    discrete = hasattr(space, "n")
    obs_shape = tuple(self.env.observation_space(self.params).shape)
    if discrete:
      self.spec = EnvSpec(f"gymnax/{name}", obs_shape, True, int(space.n), max_episode_steps=limit)
    else:
      low, high = float(jnp.min(space.low)), float(jnp.max(space.high))
      self.spec = EnvSpec(f"gymnax/{name}", obs_shape, False, int(space.shape[0]) if space.shape else 1,
                          low, high, max_episode_steps=limit)

  def reset_core(self, key):
    obs, st = self.env.reset_env(key, self.params)
    return st, obs

  def step_core(self, key, core, action):
    if not self.spec.discrete and self.env.action_space(self.params).shape == ():
      action = action[..., 0]
    obs, st, reward, terminated, _ = self.env.step_env(key, core, action, self.params)
    return st, obs, reward, terminated


class BraxEnv(Env):
  """A brax environment (brax 0.14.2, `brax.envs.get_environment`), actions in [-1, 1].

  Args:
    name: 'inverted_pendulum', 'hopper', 'halfcheetah', 'ant', ... (BRAX_ENVS).
    backend: 'spring' | 'positional' | 'generalized' | 'mjx'; None picks BRAX_DEFAULT_BACKEND (fastest on CPU).
    max_episode_steps: time limit (brax's training default is 1000).
    reset_mode: 'cached' (default, brax's own auto-reset: each env restarts from its first initial state) or
      'fresh' (a new random initial state per episode; ~20% slower rollouts on CPU).
    **kwargs: passed to the brax environment constructor.
  """

  def __init__(self, name: str, backend: str | None = None, max_episode_steps: int = 1000,
               reset_mode: str = "cached", **kwargs: Any):
    import warnings

    from brax import envs as brax_envs
    if name not in BRAX_ENVS:
      raise ValueError(f"unknown brax environment '{name}'; choose one of {BRAX_ENVS}.")
    backend = backend or BRAX_DEFAULT_BACKEND.get(name, "generalized")
    if backend not in ("spring", "positional", "generalized", "mjx"):
      raise ValueError(f"unknown brax backend '{backend}'; choose spring, positional, generalized or mjx.")
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # brax warns that it is unmaintained on every load
      self.env = brax_envs.get_environment(name, backend=backend, **kwargs)
    self.backend = backend
    self.reset_mode = reset_mode
    self.spec = EnvSpec(f"brax/{name}", (int(self.env.observation_size),), False, int(self.env.action_size),
                        -1.0, 1.0, max_episode_steps=max_episode_steps)

  def reset_core(self, key):
    st = self.env.reset(key)
    return st, st.obs

  def step_core(self, key, core, action):
    del key  # brax dynamics are deterministic
    # brax's envs update `state.metrics` in place (hopper writes Python floats into it): step on a copy.
    core = core.replace(metrics=dict(core.metrics), info=dict(core.info))
    st = self.env.step(core, action)
    return st, st.obs, st.reward, st.done > 0.5


def make_env(name: str, **kwargs: Any) -> Env:
  """Builds an environment from a name 'family/id'.

  Args:
    name: 'gymnax/CartPole-v1', 'brax/hopper', 'maze/umaze' (also 'maze/medium', 'maze/large', 'maze/open').
    **kwargs: passed to the adapter (backend, max_episode_steps, maze options ...).

  Returns:
    An Env.
  """
  if "/" not in name:
    raise ValueError(f"environment name '{name}' must be 'family/id' with family gymnax, brax or maze, "
                     "e.g. 'gymnax/CartPole-v1', 'brax/inverted_pendulum', 'maze/umaze'.")
  family, env_id = name.split("/", 1)
  if family == "gymnax":
    return GymnaxEnv(env_id, **kwargs)
  if family == "brax":
    return BraxEnv(env_id, **kwargs)
  if family == "maze":
    from iclr24_jax.rl import maze
    return maze.PointMaze(env_id, **kwargs)
  raise ValueError(f"unknown environment family '{family}' in '{name}'; choose gymnax, brax or maze "
                   "(NetHack is host-side: iclr24_jax.rl.nethack.NetHackVecEnv).")
