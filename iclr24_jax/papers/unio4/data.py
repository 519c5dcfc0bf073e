"""Offline data for Uni-O4: D4RL-style dicts -> an `OfflineData` pytree with SARSA next actions, Monte-Carlo
returns and (frozen) observation statistics; on-device minibatch sampling.

The official buffer (buffer.py) stores s, a, r, s', a' (the next row's action), not_done = 1 - terminal and the
discounted return-to-go G_t = r_t + gamma * not_done_t * G_{t+1}; it fits V(s) to G (SARSA path) and Q(s, a) to
r + gamma * not_done * Q'(s', a').
"""
from __future__ import annotations

from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.rl import normalization
from iclr24_jax.rl import offline as _offline

REQUIRED = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
# Statistics frozen by a huge count: normalization.update (called by the online PPO each rollout) then moves
# them by ~1e-9 relative, i.e. the offline normalisation is kept online, as the official code does
# (Normalization(..., update=False)).
FROZEN_COUNT = 1e12


@flax.struct.dataclass
class OfflineData:
  """Transitions on device (rows may be padded up to a fixed size so compiled programs are reused).

  Attributes:
    observations: [N, D] raw states s.
    actions: [N, A] env actions a in [-1, 1].
    rewards: [N] rewards (times reward_scale).
    next_observations: [N, D] s'.
    next_actions: [N, A] a' (the next row's action inside an episode; a itself at a truncation, see below).
    not_done: [N] 1 - terminal (truncations bootstrap).
    returns: [N] discounted return-to-go, reset at every episode end (terminal or timeout).
    num_rows: [] int32, the number of valid rows (sampling draws from [0, num_rows)).
    obs_stats: normalization.RunningStats used by every network (identity when state_norm is off).
  """

  observations: jax.Array
  actions: jax.Array
  rewards: jax.Array
  next_observations: jax.Array
  next_actions: jax.Array
  not_done: jax.Array
  returns: jax.Array
  num_rows: jax.Array
  obs_stats: normalization.RunningStats

  @property
  def obs_dim(self) -> int:
    return int(self.observations.shape[-1])

  @property
  def action_dim(self) -> int:
    return int(self.actions.shape[-1])


def validate(ds: Mapping[str, Any]) -> None:
  """Raises ValueError naming the problem when a D4RL-style dict is unusable for continuous-control Uni-O4."""
  missing = [k for k in REQUIRED if k not in ds]
  if missing:
    raise ValueError(f"unio4: data set lacks {missing}; it needs {list(REQUIRED)} (iclr24_jax.rl.offline."
                     "get_dataset / load_dataset give that format).")
  n = len(ds["observations"])
  if n < 2:
    raise ValueError(f"unio4: data set has {n} rows; need at least 2.")
  bad = {k: len(ds[k]) for k in REQUIRED if len(ds[k]) != n}
  if bad:
    raise ValueError(f"unio4: data set arrays differ in length (observations {n}): {bad}.")
  obs, act = np.asarray(ds["observations"]), np.asarray(ds["actions"])
  if obs.ndim != 2 or act.ndim != 2:
    raise ValueError(f"unio4: observations must be [N, D] and actions [N, A] (continuous actions); got "
                     f"{obs.shape} and {act.shape}.")
  for k in ("observations", "actions", "rewards", "next_observations"):
    if not np.all(np.isfinite(np.asarray(ds[k], np.float64))):
      raise ValueError(f"unio4: data set '{k}' contains NaN or inf; clean or drop those rows first.")


def discounted_returns(rewards: np.ndarray, episode_ends: np.ndarray, gamma: float) -> np.ndarray:
  """G_t = r_t + gamma (1 - end_t) G_{t+1}, computed backwards over the rows (float64).

  Args:
    rewards: [N]; episode_ends: [N] bool (terminal or timeout at t); gamma: discount.

  Returns:
    [N] float32 returns-to-go.
  """
  checks.in_range("unio4.discounted_returns", "gamma", gamma, 0.0, 1.0, hint="the discount.")
  if np.shape(rewards) != np.shape(episode_ends) or np.ndim(rewards) != 1:
    raise checks.ShapeError(f"unio4.discounted_returns: rewards and episode_ends must be matching [N]; got "
                            f"{np.shape(rewards)} and {np.shape(episode_ends)}.")
  g = np.zeros(len(rewards), np.float64)
  acc = 0.0
  r = np.asarray(rewards, np.float64)
  ends = np.asarray(episode_ends, bool)
  for t in range(len(r) - 1, -1, -1):
    acc = r[t] + (0.0 if ends[t] else gamma * acc)
    g[t] = acc
  return g.astype(np.float32)


def frozen_stats(observations: np.ndarray) -> normalization.RunningStats:
  """Mean/variance of the data's states as RunningStats with a huge count (effectively frozen)."""
  obs = np.asarray(observations, np.float64)
  var = obs.var(0)
  return normalization.RunningStats(jnp.asarray(FROZEN_COUNT, jnp.float32), jnp.asarray(obs.mean(0), jnp.float32),
                                    jnp.asarray(var * FROZEN_COUNT, jnp.float32))


def prepare(ds: Mapping[str, Any], gamma: float = 0.99, reward_scale: float = 1.0, state_norm: bool = True,
            pad_to: int | None = None) -> OfflineData:
  """Builds OfflineData from a D4RL-style dict.

  Args:
    ds: observations [N, D], actions [N, A], rewards [N], next_observations [N, D], terminals [N], timeouts [N].
    gamma: discount of the returns-to-go.
    reward_scale: multiplies the rewards (the online PPO must use the same scale for the transferred V).
    state_norm: normalise states with the data's mean/std for every network (the official flag
      `is_state_norm`; off by default there, on here, see README).
    pad_to: pad the arrays (cyclically) to this many rows so data sets of different sizes share compiled
      programs; sampling still draws only the first N rows.

  Returns:
    OfflineData.

  Deviation: the official buffer uses observations[t + 1] / actions[t + 1] as s', a' and does not reset the
  returns at timeouts (it crosses episode boundaries there); here s' is the data set's next_observations, the
  returns restart at every episode end, and at a truncation a' (unknown) is replaced by a itself.
  """
  validate(ds)
  obs = np.asarray(ds["observations"], np.float32)
  act = np.asarray(ds["actions"], np.float32)
  n = len(obs)
  rew = np.asarray(ds["rewards"], np.float32).reshape(n) * float(reward_scale)
  term = np.asarray(ds["terminals"], bool).reshape(n)
  tout = np.asarray(ds["timeouts"], bool).reshape(n)
  ends = term | tout
  ends[-1] = True
  nxt_act = act.copy()
  cont = ~ends[:-1]
  nxt_act[:-1][cont] = act[1:][cont]
  ret = discounted_returns(rew, ends, gamma)
  arrays = {"observations": obs, "actions": act, "rewards": rew,
            "next_observations": np.asarray(ds["next_observations"], np.float32), "next_actions": nxt_act,
            "not_done": (~term).astype(np.float32), "returns": ret}
  if pad_to is not None:
    if pad_to < n:
      raise ValueError(f"unio4: pad_to={pad_to} is smaller than the data set ({n} rows); raise data.pad_to.")
    arrays = {k: np.resize(v, (pad_to,) + v.shape[1:]) for k, v in arrays.items()}
  stats = frozen_stats(obs) if state_norm else normalization.init(obs.shape[1:])
  return OfflineData(**{k: jnp.asarray(v) for k, v in arrays.items()}, num_rows=jnp.asarray(n, jnp.int32),
                     obs_stats=stats)


def sample(key: jax.Array, data: OfflineData, batch_size: int) -> dict[str, jax.Array]:
  """A uniform minibatch of valid rows (with replacement, as the official buffer samples).

  Returns:
    dict with observations [B, D], actions [B, A], rewards [B], next_observations [B, D], next_actions [B, A],
    not_done [B], returns [B].
  """
  idx = jax.random.randint(key, (batch_size,), 0, data.num_rows)
  return {k: getattr(data, k)[idx] for k in ("observations", "actions", "rewards", "next_observations",
                                               "next_actions", "not_done", "returns")}


def normalize_obs(stats: normalization.RunningStats, obs: jax.Array, obs_clip: float = 10.0) -> jax.Array:
  """The input transform of every Uni-O4 network (identity for empty statistics)."""
  return normalization.normalize(stats, obs, obs_clip)


# ----------------------------------------------------------------------------------------------------------
# The paper's D4RL data sets (HDF5 files as D4RL downloads them).

DATASETS = {
    **{n: "D4RL Gym-MuJoCo v2 HDF5 (observations, actions, rewards, terminals, timeouts)" for n in
       _offline.D4RL_LOCOMOTION},
    **{n: "D4RL AntMaze v2 HDF5 (+ infos/goal)" for n in _offline.D4RL_ANTMAZE},
    **{n: "D4RL Adroit v1 HDF5" for n in _offline.D4RL_ADROIT},
    **{n: "D4RL Kitchen v0 HDF5" for n in _offline.D4RL_KITCHEN},
}


def load(data_config) -> dict[str, np.ndarray]:
  """The D4RL data set `config.data.name` from `config.data.data_dir` (e.g. ~/.d4rl/datasets).

  Args:
    data_config: config.data with `name` (a D4RL id in DATASETS, e.g. 'hopper-medium-v2') and `data_dir` (the
      folder holding the HDF5 file, searched recursively, or the file; '' = `$ICLR24_DATA/d4rl`).

  Returns:
    the D4RL-format dict of `rl.offline.load_d4rl` (observations [N, D] float32, actions [N, A], rewards [N],
    next_observations, terminals / timeouts [N] bool), ready for `prepare`.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: the file is not there (the message gives D4RL's
      file names and how to download them). common.data.DataFormatError: keys, ranks or dtypes differ from D4RL's.
  """
  from iclr24_jax.common import data as common_data
  name = common_data.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown Uni-O4 D4RL data set '{name}'; choose one of {sorted(DATASETS)} (or the generated "
                     "'brax/<env>' sets).")
  root = common_data.locate_data(data_config, "d4rl", what=f"D4RL '{name}'",
                                 layout=f"one of {_offline.d4rl_filenames(name)}", source=_offline.D4RL_SOURCE)
  ds = _offline.load_d4rl(name, root)
  validate(ds)
  return ds
