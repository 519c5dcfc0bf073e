"""NetHack through `nle` 1.3.0 + gymnasium 1.2.0: a host-side vectorised adapter and a small policy network.

NetHack is a C game, so it runs on the host; the policy runs in JAX (see ppo_host.HostPPO).

  env = NetHackVecEnv(num_envs=4, seed=0)          # gymnasium.vector (sync, or async = one process each)
  obs = env.reset()                                # dict: glyphs [N, 21, 79] int16, blstats [N, 27] int64,
                                                   #       message [N, 256] uint8
  obs, reward, terminated, truncated, info = env.step(actions)   # actions [N] int in [0, env.num_actions)
  info['final_obs']                                # the observation before the auto-reset (== obs where not done)
  decode_messages(obs['message'])                  # -> list of N strings
  saved = env.get_state()                          # JSON: each game as its replay (for a checkpoint)
  obs = env.set_state(saved)                       # a new env: replays the games, checks their observations

Auto-reset happens in the same step (gymnasium's SAME_STEP mode): after an episode ends, `obs` is already the
first observation of the next one, and `info['final_obs']` holds the last observation of the ended episode.
"""
from __future__ import annotations

import importlib
import zlib
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


class ReplayMismatch(RuntimeError):
  """A game replayed from a saved state did not reproduce its observations (`NetHackVecEnv.set_state`)."""


def _encode_rng_state(state: dict) -> dict:
  """numpy's bit-generator state with its 128-bit integers as strings (JSON-safe)."""
  inner = {k: str(v) for k, v in state["state"].items()}
  return dict(state, state=inner)


def _decode_rng_state(saved: dict) -> dict:
  return dict(saved, state={k: int(v) for k, v in saved["state"].items()})


def _obs_crc(obs: dict, crc: int = 0) -> int:
  """crc32 of one game's observation arrays (every key, in sorted order), continuing `crc`."""
  for k in sorted(obs):
    crc = zlib.crc32(np.ascontiguousarray(obs[k]).tobytes(), crc)
  return int(crc)


def _seeded_wrapper_cls():
  import gymnasium as gym

  class SeededNetHack(gym.Wrapper):
    """Seeds NetHack's own RNGs (core, disp; no anti-TAS reseeding) before every reset from a private stream, so
    a run is reproducible and every episode is a different game. (gymnasium's reset(seed=) does not reach them.)

    It also records what replays the current episode, since NetHack's C state cannot be saved: the stream's state
    before the episode's seeds were drawn, the actions taken since, and a crc32 chained over every observation of
    the episode, which a replay must reproduce (`replay_state` / `replay`)."""

    def __init__(self, env, seed: int, index: int = 0):
      super().__init__(env)
      self.index = index
      self._rng = np.random.default_rng(seed)
      self._episode_rng = self._rng.bit_generator.state
      self._actions: list[int] = []
      self._crc: int | None = None

    def reset(self, *, seed=None, options=None):
      if seed is not None:
        self._rng = np.random.default_rng(seed)
      self._episode_rng, self._actions = self._rng.bit_generator.state, []
      core, disp = (int(x) for x in self._rng.integers(0, 2**62, size=2))
      self.env.unwrapped.seed(core=core, disp=disp, reseed=False)
      obs, info = self.env.reset(options=options)
      self._crc = _obs_crc(obs)
      return obs, info

    def step(self, action):
      self._actions.append(int(action))
      out = self.env.step(action)
      self._crc = _obs_crc(out[0], self._crc)
      return out

    def replay_state(self) -> dict:
      """{'rng': the seed stream's state at the current episode's reset, 'actions': its actions so far, 'crc':
      the crc32 chained over its observations (None before the first reset)}."""
      return {"rng": _encode_rng_state(self._episode_rng), "actions": list(self._actions), "crc": self._crc}

    def replay(self, saved: dict):
      """Resets to the saved episode's seeds and steps its actions; returns the last observation.

      Raises:
        ReplayMismatch: the replayed observations differ from the saved episode's (their chained crc32).
      """
      self._rng.bit_generator.state = _decode_rng_state(saved["rng"])
      obs, _ = self.reset()
      done = False
      for a in saved["actions"]:
        obs, _, term, trunc, _ = self.step(a)
        done = done or term or trunc
      if done or self._crc != int(saved["crc"]):
        # nle 1.3.0 reads the wall clock (moon phase, night, and flavour hashed from the game's start time such as
        # shopkeeper names: NetHack-LE/nle#129), so a replay in another second can differ where those show.
        raise ReplayMismatch(
            f"NetHack game {self.index} replayed from the checkpoint ({len(saved['actions'])} actions into its "
            "episode) does not reproduce the saved observations: the game is not reproducible here (another nle "
            "build, or game details nle derives from the wall clock: the moon phase, night, and flavour hashed "
            "from the game's start time, such as shopkeeper names). Start the run afresh (--fresh).")
      return obs

    def replay_own(self, saved: Sequence[dict]):
      """`replay(saved[index])`: one call for every game of a vector env (gymnasium's `call` passes the same
      arguments to each)."""
      return self.replay(saved[self.index])

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
      return lambda: wrapper(gym.make(task, **make_kwargs), seed + i, i)

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

  def get_state(self) -> dict[str, Any]:
    """What puts every game back where it is now (JSON-safe), for a checkpoint.

    NetHack's C state cannot be saved, so each game is kept as its replay: the seed stream's state at the
    current episode's reset, the actions since (at most the episode's step limit) and a crc32 chained over the
    episode's observations, which `set_state` checks the replay against; with the episodes' running returns and
    lengths.

    Returns:
      dict: games (one replay dict per game: rng, actions, crc), episode_return [N], episode_length [N].

    Raises:
      RuntimeError: before the first reset (there is no game yet).
    """
    games = list(self.venv.call("replay_state"))
    if any(g["crc"] is None for g in games):
      raise RuntimeError("NetHackVecEnv.get_state: reset the environment first.")
    return {"games": games, "episode_return": self.episode_return.tolist(),
            "episode_length": self.episode_length.tolist()}

  def set_state(self, saved: dict[str, Any]) -> dict[str, np.ndarray]:
    """Puts every game back where `get_state` saw it (by replaying its episode) and returns the observation.

    Args:
      saved: a `get_state` dict of an env with the same num_envs, task and keyword arguments.

    Returns:
      obs dict of [N, ...] arrays: the observation the saved games were at.

    Raises:
      ValueError: the saved state holds another number of games.
      ReplayMismatch: a replayed game did not reproduce the saved episode's observations (another nle build, or
        game details nle derives from the wall clock); start the run afresh.
    """
    games = saved["games"]
    if len(games) != self.num_envs:
      raise ValueError(f"the saved NetHack state holds {len(games)} games; this env has {self.num_envs}.")
    per_game = self.venv.call("replay_own", games)
    obs = {k: np.stack([np.asarray(o[k]) for o in per_game]) for k in self.observation_keys}
    self.episode_return[:] = np.asarray(saved["episode_return"], np.float64)
    self.episode_length[:] = np.asarray(saved["episode_length"], np.int64)
    return obs

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
