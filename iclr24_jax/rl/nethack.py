"""NetHack through `nle` 1.3.0 + gymnasium 1.2.0: a host-side vectorised adapter and a small policy network.

NetHack is a C game, so it runs on the host; the policy runs in JAX (see ppo_host.HostPPO).

  env = NetHackVecEnv(num_envs=4, seed=0)          # gymnasium.vector (sync, or async = one process each)
  obs = env.reset()                                # dict: glyphs [N, 21, 79] int16, blstats [N, 27] int64,
                                                   #       message [N, 256] uint8
  obs, reward, terminated, truncated, info = env.step(actions)   # actions [N] int in [0, env.num_actions)
  info['final_obs']                                # the observation before the auto-reset (== obs where not done)
  decode_messages(obs['message'])                  # -> list of N strings

Auto-reset happens in the same step (gymnasium's SAME_STEP mode): after an episode ends, `obs` is already the
first observation of the next one, and `info['final_obs']` holds the last observation of the ended episode.
"""
from __future__ import annotations

import importlib
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.rl import distributions

DEFAULT_KEYS = ("glyphs", "blstats", "message")
MAP_SHAPE = (21, 79)
MESSAGE_LEN = 256
BLSTATS_LEN = 27


def _nle():
  try:
    importlib.import_module("nle")  # registers the NetHack gymnasium envs
    from nle import nethack
  except ImportError as e:
    raise ImportError("NetHack needs the 'nle' package (pip install nle==1.3.0 gymnasium==1.2.0).") from e
  return nethack


def blstats_names() -> list[str]:
  """Names of the 27 bottom-line statistics in index order ('x', 'y', 'str25', ..., 'hp', 'hpmax', ...)."""
  nethack = _nle()
  pairs = sorted((getattr(nethack, n), n[len("NLE_BL_"):].lower()) for n in dir(nethack) if n.startswith("NLE_BL_"))
  return [n for _, n in pairs]


def max_glyph() -> int:
  """NLE's MAX_GLYPH: the number of glyph ids (glyph observations lie in [0, max_glyph)); needs nle installed."""
  return int(_nle().MAX_GLYPH)


def decode_message(message: np.ndarray) -> str:
  """One NetHack message buffer [256] uint8 (NUL-terminated) -> text."""
  m = np.asarray(message, np.uint8).reshape(-1)
  end = np.flatnonzero(m == 0)
  m = m[: end[0]] if end.size else m
  return m.tobytes().decode("latin-1").rstrip()


def decode_messages(messages: np.ndarray) -> list[str]:
  """[N, 256] uint8 -> N strings."""
  return [decode_message(m) for m in np.asarray(messages).reshape(-1, np.asarray(messages).shape[-1])]


def _stack_dicts(items: Sequence[dict]) -> dict[str, np.ndarray]:
  return {k: np.stack([np.asarray(it[k]) for it in items]) for k in items[0]}


def _seeded_wrapper_cls():
  import gymnasium as gym

  class SeededNetHack(gym.Wrapper):
    """Seeds NetHack's own RNGs (core, disp; no anti-TAS reseeding) before every reset from a private stream, so
    a run is reproducible and every episode is a different game. (gymnasium's reset(seed=) does not reach them.)"""

    def __init__(self, env, seed: int):
      super().__init__(env)
      self._rng = np.random.default_rng(seed)

    def reset(self, *, seed=None, options=None):
      if seed is not None:
        self._rng = np.random.default_rng(seed)
      core, disp = (int(x) for x in self._rng.integers(0, 2**62, size=2))
      self.env.unwrapped.seed(core=core, disp=disp, reseed=False)
      return self.env.reset(options=options)

  return SeededNetHack


class NetHackVecEnv:
  """Several NetHack games stepped together on the host.

  Args:
    num_envs: number of games.
    task: a NetHack gymnasium id ('NetHackScore-v0', 'NetHackChallenge-v0', ...).
    observation_keys: nle observation keys (default glyphs, blstats, message).
    seed: base seed; game i draws the NetHack seeds of its successive episodes from a stream seeded seed + i, so
      the same seed and actions replay the same games.
    asynchronous: one subprocess per game (gymnasium.vector.AsyncVectorEnv); else a loop in this process.
    max_episode_steps: nle's own step limit (default 5000 in nle).
    **kwargs: passed to `gymnasium.make` (e.g. character='mon-hum-neu-mal', penalty_step=-0.01).
  """

  def __init__(self, num_envs: int = 4, task: str = "NetHackScore-v0", observation_keys: Sequence[str] = DEFAULT_KEYS,
               seed: int = 0, asynchronous: bool = False, max_episode_steps: int | None = None, **kwargs: Any):
    import gymnasium as gym
    _nle()
    if num_envs < 1:
      raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
    if task not in gym.registry:
      known = sorted(k for k in gym.registry if k.startswith("NetHack"))
      raise ValueError(f"unknown NetHack task '{task}'; choose one of {known}.")
    self.observation_keys = tuple(observation_keys)
    make_kwargs = dict(observation_keys=self.observation_keys, **kwargs)
    if max_episode_steps is not None:
      make_kwargs["max_episode_steps"] = int(max_episode_steps)

    wrapper = _seeded_wrapper_cls()

    def make(i):
      return lambda: wrapper(gym.make(task, **make_kwargs), seed + i)

    cls = gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    self.venv = cls([make(i) for i in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    self.num_envs, self.task, self.seed = num_envs, task, seed
    self.num_actions = int(self.venv.single_action_space.n)
    self.observation_space = self.venv.single_observation_space
    self.episode_return = np.zeros(num_envs, np.float64)
    self.episode_length = np.zeros(num_envs, np.int64)

  def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
    """Resets every game (with `seed`, game i's seed stream restarts at seed + i)."""
    obs, _ = self.venv.reset(seed=None if seed is None else [seed + i for i in range(self.num_envs)])
    self.episode_return[:] = 0
    self.episode_length[:] = 0
    return {k: np.asarray(v) for k, v in obs.items()}

  def step(self, actions: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, dict]:
    """Steps every game.

    Args:
      actions: [N] ints in [0, num_actions).

    Returns:
      (obs dict of [N, ...], reward [N] float32, terminated [N] bool, truncated [N] bool, info) with info keys
      'final_obs' (dict of [N, ...]: pre-reset observations), 'episode_return' / 'episode_length' ([N], the
      finished episode's totals where done, else 0), and gymnasium's own entries.
    """
    actions = np.asarray(actions).reshape(self.num_envs)
    if actions.min() < 0 or actions.max() >= self.num_actions:
      raise ValueError(f"NetHack actions must be in [0, {self.num_actions}), got {actions.min()}..{actions.max()}.")
    obs, reward, term, trunc, info = self.venv.step(actions)
    obs = {k: np.asarray(v) for k, v in obs.items()}
    reward = np.asarray(reward, np.float32)
    term, trunc = np.asarray(term, bool), np.asarray(trunc, bool)
    done = term | trunc
    final = {k: v.copy() for k, v in obs.items()}
    if done.any() and "final_obs" in info:
      for i in np.flatnonzero(done):
        fo = info["final_obs"][i]
        if fo is not None:
          for k in final:
            final[k][i] = fo[k]
    self.episode_return += reward
    self.episode_length += 1
    ep_ret = np.where(done, self.episode_return, 0.0)
    ep_len = np.where(done, self.episode_length, 0)
    self.episode_return[done] = 0.0
    self.episode_length[done] = 0
    info = dict(info)
    info.update(final_obs=final, episode_return=ep_ret, episode_length=ep_len)
    return obs, reward, term, trunc, info

  def close(self) -> None:
    """Closes the underlying gymnasium vector environment of the NetHack games."""
    self.venv.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class NetHackNet(nn.Module):
  """A small NetHack actor-critic: egocentric glyph crop + coarse map conv + bottom line + message bytes.

  Inputs: dict with glyphs [B, 21, 79] int, blstats [B, 27], message [B, 256] uint8.
  Returns (Categorical over num_actions, value [B]).

  Attributes:
    num_actions: size of the action set.
    crop: side of the egocentric glyph crop (odd).
    glyph_dim, msg_dim, hidden: widths.
    use_map: add a strided conv over the whole map.
  """

  num_actions: int
  crop: int = 9
  glyph_dim: int = 16
  msg_dim: int = 32
  hidden: int = 256
  use_map: bool = True
  num_glyphs: int = 5977

  @nn.compact
  def __call__(self, obs: dict[str, jax.Array]):
    glyphs = jnp.asarray(obs["glyphs"]).astype(jnp.int32)
    blstats = jnp.asarray(obs["blstats"]).astype(jnp.float32)
    b = glyphs.shape[0]
    emb = nn.Embed(self.num_glyphs, self.glyph_dim, name="glyph_embed")
    r = self.crop // 2
    padded = jnp.pad(glyphs, ((0, 0), (r, r), (r, r)), constant_values=0)
    x = jnp.clip(blstats[:, 0].astype(jnp.int32), 0, MAP_SHAPE[1] - 1)
    y = jnp.clip(blstats[:, 1].astype(jnp.int32), 0, MAP_SHAPE[0] - 1)
    crop = jax.vmap(lambda g, yy, xx: jax.lax.dynamic_slice(g, (yy, xx), (self.crop, self.crop)))(padded, y, x)
    feats = [nn.relu(nn.Dense(128)(emb(crop).reshape(b, -1)))]
    if self.use_map:
      m = emb(glyphs)
      m = nn.relu(nn.Conv(16, (3, 3), strides=(2, 2))(m))
      m = nn.relu(nn.Conv(16, (3, 3), strides=(2, 2))(m))
      feats.append(nn.relu(nn.Dense(128)(m.reshape(b, -1))))
    feats.append(nn.relu(nn.Dense(64)(jnp.sign(blstats) * jnp.log1p(jnp.abs(blstats)))))
    msg = jnp.asarray(obs["message"]).astype(jnp.int32)
    mask = (msg > 0).astype(jnp.float32)[..., None]
    me = nn.Embed(256, self.msg_dim, name="message_embed")(msg)
    feats.append(nn.relu(nn.Dense(64)(jnp.sum(me * mask, 1) / jnp.maximum(jnp.sum(mask, 1), 1.0))))
    h = nn.relu(nn.Dense(self.hidden)(jnp.concatenate(feats, axis=-1)))
    logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(h)
    value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(h)[..., 0]
    return distributions.Categorical(logits), value
