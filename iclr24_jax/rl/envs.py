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

from typing import Any

import jax.numpy as jnp

from iclr24_jax.rl.env_base import Env, EnvSpec

# Fastest brax backend on CPU per environment, measured here (see module docstring / README.md).
BRAX_DEFAULT_BACKEND = {"inverted_pendulum": "spring", "inverted_double_pendulum": "spring", "hopper": "spring",
                        "halfcheetah": "spring", "ant": "spring", "walker2d": "spring", "reacher": "spring"}
BRAX_ENVS = ("ant", "halfcheetah", "hopper", "humanoid", "humanoidstandup", "inverted_pendulum",
             "inverted_double_pendulum", "pusher", "reacher", "swimmer", "walker2d")


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
    """Env.reset_core: gymnax's reset_env -> (gymnax state, obs [*obs_shape])."""
    obs, st = self.env.reset_env(key, self.params)
    return st, obs

  def step_core(self, key, core, action):
    """Env.step_core: gymnax's step_env (no auto-reset) -> (state, obs, reward [], terminated []); a continuous
    action [1] is squeezed for scalar action spaces.
    """
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
    """Env.reset_core: brax's reset -> (brax State, obs [observation_size])."""
    st = self.env.reset(key)
    return st, st.obs

  def step_core(self, key, core, action):
    """Env.step_core: brax's step on a copy of the state (deterministic; key unused) -> (State, obs, reward [],
    terminated [] = brax's done).
    """
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
