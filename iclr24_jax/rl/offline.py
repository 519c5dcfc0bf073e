"""Offline (D4RL-style) data sets generated here, deterministically, and read from users' D4RL files.

D4RL itself cannot be downloaded here, so the data sets are made by code and cached (never committed):

  ds = offline.get_dataset('brax/inverted_pendulum', 'medium')    # generates once, then loads the cache
  ds = offline.get_dataset('maze/umaze', 'noisy')                 # D4RL-maze2d-like waypoint data
  score = offline.normalized_score('brax/hopper', returns)        # 100 (R - R_random) / (R_expert - R_random)
  ds = offline.load_dataset('/path/to/hopper-medium-v2.hdf5')     # a user's D4RL file (.hdf5 needs h5py) or .npz

Format: a dict of numpy arrays, one row per transition, episodes contiguous:
  observations [N, D] float32, actions [N, A] float32 (or [N] int32 for discrete envs), rewards [N] float32,
  next_observations [N, D] float32, terminals [N] bool, timeouts [N] bool, and for mazes goals [N, 2].

Kinds (brax / JAX envs with a continuous policy):
  random        uniform random actions.
  medium        a PPO policy stopped part-way (the training snapshot whose return is closest to
                R_random + (R_expert - R_random) / 3, D4RL's "about a third of the expert").
  medium-replay the training data up to that snapshot: PPO's rollouts of every update (every k-th update when
                the whole run exceeds 200k env steps, a uniform subsample) up to the medium snapshot.
                Deviation: D4RL's is a SAC replay buffer; PPO keeps none, so its on-policy rollouts are kept.
  expert        the final PPO policy (stochastic actions, as D4RL's expert data).
  medium-expert medium + expert concatenated (D4RL).
Kinds (mazes): random, noisy (the waypoint controller with Gaussian action noise and a new random goal each
time one is reached, as D4RL's maze2d data; episodes cut by the time limit), expert (noise-free controller).

Reference returns (random and expert policies' mean episode return on the evaluation environment) are
measured here by `measure_reference_returns` and recorded in `reference_returns.json` beside this file.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import compile_cache
from iclr24_jax.rl import envs as envs_lib
from iclr24_jax.rl import maze as maze_lib
from iclr24_jax.rl import rollout as rollout_lib

REQUIRED_KEYS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
BRAX_KINDS = ("random", "medium", "medium-replay", "expert", "medium-expert")
MAZE_KINDS = ("random", "noisy", "expert")
REFERENCE_FILE = pathlib.Path(__file__).resolve().parent / "reference_returns.json"
CACHE_ENV = "ICLR24_RL_CACHE"
FORMAT_VERSION = 2

# The data agent of each environment: a PPO preset of configs/ppo.py (`preset(name)`), passed as agent_config.
AGENT_PRESETS = {"brax/inverted_pendulum": "inverted_pendulum", "brax/hopper": "hopper"}
# Env kwargs used both for data and for the reference returns.
ENV_KWARGS: dict[str, dict] = {}


def default_cache_dir() -> pathlib.Path:
  """`$ICLR24_RL_CACHE`, else the project's cache root (`compile_cache.cache_root`) / rl (a temporary folder of
  this process when `ICLR24_JAX_CACHE=off`)."""
  env = os.environ.get(CACHE_ENV)
  if env:
    return pathlib.Path(env)
  root = compile_cache.cache_root()
  return pathlib.Path(root) / "rl" if root is not None else pathlib.Path(_process_tmp()) / "rl"


@functools.lru_cache(maxsize=1)
def _process_tmp() -> str:
  """One temporary folder per process (the lru_cache keeps it the same across calls)."""
  import tempfile
  return tempfile.mkdtemp(prefix="iclr24_jax_rl_")


# --- format ---------------------------------------------------------------------------------------------------
def validate_dataset(ds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Checks keys, lengths and finiteness; returns the data set. Raises ValueError naming the problem."""
  missing = [k for k in REQUIRED_KEYS if k not in ds]
  if missing:
    raise ValueError(f"offline data set lacks {missing}; a D4RL-style file needs {list(REQUIRED_KEYS)} "
                     "(next_observations can be rebuilt with fill_next_observations).")
  n = len(ds["observations"])
  bad = {k: len(ds[k]) for k in REQUIRED_KEYS if len(ds[k]) != n}
  if bad:
    raise ValueError(f"offline data set arrays differ in length: observations has {n} rows, {bad}.")
  for k in ("observations", "actions", "rewards", "next_observations"):
    if np.issubdtype(np.asarray(ds[k]).dtype, np.floating) and not np.all(np.isfinite(ds[k])):
      raise ValueError(f"offline data set '{k}' contains NaN or inf values.")
  return ds


def save_npz(path: str | os.PathLike, ds: dict[str, np.ndarray], meta: dict | None = None) -> str:
  """Writes a data set (and JSON metadata under key 'meta') atomically as .npz; returns the path.

  Args:
    path: output .npz path (folders created).
    ds: data set dict of numpy arrays (see the module docstring's format).
    meta: optional JSON-serialisable dict, stored as a 0-d string array 'meta'.

  Returns:
    path as str.
  """
  path = str(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp.npz"
  arrays = dict(ds)
  if meta is not None:
    arrays["meta"] = np.asarray(json.dumps(meta))
  np.savez_compressed(tmp, **arrays)
  os.replace(tmp, path)
  return path


def fill_next_observations(ds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Adds next_observations from observations[i + 1], as d4rl.qlearning_dataset does.

  Rows whose successor is unknown (a timeout, or the last row) are dropped; terminal rows keep
  observations[i + 1] (unused: no bootstrapping past a terminal).
  """
  n = len(ds["observations"])
  timeouts = np.asarray(ds.get("timeouts", np.zeros(n, bool)), bool)
  keep = ~timeouts
  keep[-1] = False
  idx = np.nonzero(keep)[0]
  out = {k: np.asarray(v)[idx] for k, v in ds.items() if np.ndim(v) >= 1 and len(v) == n}
  out["next_observations"] = np.asarray(ds["observations"])[idx + 1]
  out.setdefault("timeouts", np.zeros(len(idx), bool))
  return out


def load_dataset(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Reads a D4RL-format data set from .npz or .hdf5/.h5 (the latter needs `pip install h5py`).

  Keys are taken at the top level ('observations', ...); D4RL's 'infos/goal' becomes 'goals'. Missing
  next_observations are rebuilt (`fill_next_observations`), missing timeouts are all False.

  Raises:
    FileNotFoundError: naming the path; ValueError: when required keys are missing.
  """
  p = pathlib.Path(os.path.expanduser(str(path)))
  if not p.exists():
    raise FileNotFoundError(f"offline data set '{p}' does not exist; generate one with "
                            "iclr24_jax.rl.offline.get_dataset(env, kind) or pass a D4RL .hdf5/.npz path.")
  ds: dict[str, np.ndarray] = {}
  if p.suffix in (".hdf5", ".h5"):
    try:
      import h5py
    except ImportError as e:
      raise ImportError(f"reading {p} needs h5py (`pip install h5py`), or convert it to .npz.") from e
    with h5py.File(p, "r") as f:
      for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
        if k in f:
          ds[k] = f[k][()]
      if "infos/goal" in f:
        ds["goals"] = f["infos/goal"][()]
  else:
    with np.load(p, allow_pickle=False) as z:
      ds = {k: z[k] for k in z.files if k != "meta"}
  if "timeouts" not in ds and "observations" in ds:
    ds["timeouts"] = np.zeros(len(ds["observations"]), bool)
  if "next_observations" not in ds and "observations" in ds:
    ds = fill_next_observations(ds)
  for k in ("terminals", "timeouts"):
    if k in ds:
      ds[k] = np.asarray(ds[k]).astype(bool)
  return validate_dataset(ds)


# --- D4RL's own files ------------------------------------------------------------------------------------------
# Where D4RL keeps a data set: `~/.d4rl/datasets/<basename of its URL>` (d4rl/offline_env.py), the URLs being
# those of d4rl/infos.py. A user's folder may hold either that basename or `<env id>.hdf5`.
D4RL_SOURCE = ("D4RL (github.com/Farama-Foundation/D4RL): `import gym, d4rl; gym.make('<name>').get_dataset()` "
               "downloads the file into ~/.d4rl/datasets (point config.data.data_dir there); d4rl/infos.py lists "
               "each file's URL")
D4RL_DTYPES = {"observations": np.float32, "actions": np.float32, "rewards": np.float32, "terminals": np.bool_,
               "timeouts": np.bool_}
_ANTMAZE_V2 = {  # d4rl/infos.py: antmaze v2 file names (ant_maze_v2/)
    "antmaze-umaze-v2": "Ant_maze_u-maze_noisy_multistart_False_multigoal_False_sparse_fixed.hdf5",
    "antmaze-umaze-diverse-v2": "Ant_maze_u-maze_noisy_multistart_True_multigoal_True_sparse_fixed.hdf5",
    "antmaze-medium-play-v2": "Ant_maze_big-maze_noisy_multistart_True_multigoal_False_sparse_fixed.hdf5",
    "antmaze-medium-diverse-v2": "Ant_maze_big-maze_noisy_multistart_True_multigoal_True_sparse_fixed.hdf5",
    "antmaze-large-play-v2": "Ant_maze_hardest-maze_noisy_multistart_True_multigoal_False_sparse_fixed.hdf5",
    "antmaze-large-diverse-v2": "Ant_maze_hardest-maze_noisy_multistart_True_multigoal_True_sparse_fixed.hdf5",
}
_KITCHEN = {  # d4rl/infos.py: kitchen/ file names
    "kitchen-complete-v0": "mini_kitchen_microwave_kettle_light_slider-v0.hdf5",
    "kitchen-partial-v0": "kitchen_microwave_kettle_light_slider-v0.hdf5",
    "kitchen-mixed-v0": "kitchen_microwave_kettle_bottomburner_light-v0.hdf5",
}


D4RL_LOCOMOTION = tuple(f"{env}-{kind}-v2" for env in ("halfcheetah", "hopper", "walker2d")
                        for kind in ("random", "medium", "medium-replay", "medium-expert", "expert"))
D4RL_ANTMAZE = tuple(_ANTMAZE_V2)
D4RL_MAZE2D = tuple(f"maze2d-{layout}-v1" for layout in ("umaze", "medium", "large"))
D4RL_KITCHEN = tuple(_KITCHEN)
D4RL_ADROIT = tuple(f"{task}-{kind}-v1" for task in ("pen", "door", "hammer", "relocate")
                    for kind in ("human", "cloned", "expert"))


def d4rl_filenames(name: str) -> list[str]:
  """File names a D4RL data set `name` (its gym id, e.g. 'hopper-medium-v2') may have on disk.

  Args:
    name: the D4RL env id: '<hopper|halfcheetah|walker2d|ant>-<kind>-v2', 'maze2d-<layout>-v1',
      'antmaze-<...>-v2', 'kitchen-<...>-v0', 'pen-human-v1', ...

  Returns:
    candidate file names: '<name>.hdf5' first, then the basename of D4RL's URL.
  """
  out = [f"{name}.hdf5"]
  parts = name.split("-")
  if parts[0] in ("hopper", "halfcheetah", "walker2d", "ant") and len(parts) >= 3:
    out.append(f"{parts[0]}_{'_'.join(parts[1:-1])}-{parts[-1]}.hdf5")     # gym_mujoco_v2/hopper_medium_replay-v2
  elif parts[0] == "maze2d" and len(parts) >= 3:
    dense = "dense" in parts
    layout = "-".join(p for p in parts[1:-1] if p != "dense")
    out.append(f"maze2d-{layout}-{'dense' if dense else 'sparse'}-{parts[-1]}.hdf5")
  out += [f for k, f in {**_ANTMAZE_V2, **_KITCHEN}.items() if k == name]
  return list(dict.fromkeys(out))


def find_d4rl_file(name: str, data_dir: str | os.PathLike) -> pathlib.Path:
  """The D4RL file of `name` in `data_dir` (a folder, searched recursively, or the .hdf5 file itself).

  Raises:
    FileNotFoundError (common.data.DataNotFoundError) naming the file names tried and where to get them.
  """
  from iclr24_jax.common import data as common_data
  p = pathlib.Path(os.path.expanduser(str(data_dir)))
  if p.is_file():
    return p
  names = d4rl_filenames(name)
  if p.is_dir():
    for n in names:
      hits = sorted(p.rglob(n))
      if hits:
        return hits[0]
  raise common_data.DataNotFoundError(
      f"D4RL data set '{name}' not found in {p}: expected one of {names} (an HDF5 file with observations, "
      f"actions, rewards, terminals, timeouts). Get it: {D4RL_SOURCE}.")


def check_d4rl_file(path: str | os.PathLike) -> dict[str, tuple]:
  """Checks a D4RL HDF5 file's keys, ranks and dtypes before reading it (h5py).

  D4RL files store observations [N, D] and actions [N, A] float32, rewards [N] float32, terminals and timeouts
  [N] bool (maze2d adds infos/goal [N, 2]).

  Returns:
    {key: (shape, dtype str)} of the required keys.

  Raises:
    common.data.DataFormatError naming the missing key, wrong rank, length or dtype kind.
  """
  import h5py
  from iclr24_jax.common import data as common_data
  out = {}
  with h5py.File(path, "r") as f:
    missing = [k for k in ("observations", "actions", "rewards", "terminals") if k not in f]
    if missing:
      raise common_data.DataFormatError(f"{path} lacks {missing}; a D4RL file has observations, actions, rewards, "
                                        f"terminals and timeouts (top-level datasets). It has {sorted(f.keys())}.")
    n = f["observations"].shape[0]
    for k in ("observations", "actions", "rewards", "terminals", "timeouts"):
      if k not in f:
        continue
      d = f[k]
      rank = 2 if k in ("observations", "actions") else 1
      if d.ndim != rank or d.shape[0] != n:
        raise common_data.DataFormatError(f"{path}: '{k}' has shape {d.shape}; expected {'[N, D]' if rank == 2 else '[N]'} "
                                          f"with N = {n} (the length of observations).")
      want = np.dtype(D4RL_DTYPES[k])
      if (want.kind == "f") != (np.dtype(d.dtype).kind == "f"):
        raise common_data.DataFormatError(f"{path}: '{k}' has dtype {d.dtype}; D4RL stores {want.name}.")
      out[k] = (tuple(d.shape), str(d.dtype))
  return out


def load_d4rl(name: str, data_dir: str | os.PathLike) -> dict[str, np.ndarray]:
  """A D4RL data set from its HDF5 file: format check, then `load_dataset` (next_observations rebuilt as
  d4rl.qlearning_dataset does when the file has none; terminals / timeouts as bool).

  Args:
    name: D4RL env id, e.g. 'hopper-medium-v2', 'maze2d-large-v1' (see d4rl_filenames).
    data_dir: folder holding the file (e.g. ~/.d4rl/datasets), or the file.

  Returns:
    dict observations [N, D] float32, actions [N, A] float32, rewards [N] float32, next_observations [N, D],
    terminals [N] bool, timeouts [N] bool (+ goals [N, 2] for maze2d).
  """
  path = find_d4rl_file(name, data_dir)
  check_d4rl_file(path)
  ds = load_dataset(path)
  for k in ("observations", "actions", "rewards", "next_observations"):
    ds[k] = np.asarray(ds[k], np.float32)
  return ds


def episode_returns(ds: dict[str, np.ndarray], complete_only: bool = False) -> np.ndarray:
  """Returns of the episodes in a data set (split at terminals | timeouts; a trailing partial episode counts
  unless complete_only).

  Args:
    ds: data set with rewards [N], terminals [N] and timeouts [N].
    complete_only: drop a trailing episode that ends without a terminal / timeout.

  Returns:
    float32 [E] episode returns (summed in float64), in data order.
  """
  ends = np.asarray(ds["terminals"], bool) | np.asarray(ds["timeouts"], bool)
  r = np.asarray(ds["rewards"], np.float64)
  out, acc = [], 0.0
  for i in range(len(r)):
    acc += r[i]
    if ends[i]:
      out.append(acc)
      acc = 0.0
  if not complete_only and len(r) and not ends[-1]:
    out.append(acc)
  return np.asarray(out, np.float32)


def to_jax_batch(ds: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """The data set as JAX arrays (e.g. to put into a replay buffer: replay.uniform_add)."""
  return {k: jnp.asarray(v) for k, v in ds.items() if k != "meta"}


# --- reference returns and normalised scores ------------------------------------------------------------------
def reference_table() -> dict[str, dict]:
  """The recorded reference returns (reference_returns.json): {env: {'random': R, 'expert': R, ...}}."""
  if not REFERENCE_FILE.exists():
    return {}
  with open(REFERENCE_FILE) as f:
    return json.load(f)


def reference_returns(env_name: str) -> tuple[float, float]:
  """(R_random, R_expert) of an environment ('brax/hopper', 'maze/umaze', or 'd4rl/hopper' for D4RL's own)."""
  table = reference_table()
  if env_name not in table:
    raise KeyError(f"no reference returns recorded for '{env_name}'; known: {sorted(table)}. Measure them with "
                   "iclr24_jax.rl.offline.measure_reference_returns(env_name) and record them.")
  e = table[env_name]
  return float(e["random"]), float(e["expert"])


def normalized_score(env_name: str, returns: Any) -> np.ndarray | float:
  """D4RL's normalised score 100 * (R - R_random) / (R_expert - R_random) (array or scalar).

  Args:
    env_name: a name in reference_returns.json, e.g. 'brax/hopper', 'maze/umaze', 'd4rl/hopper'.
    returns: a return or an array of returns (any shape).

  Returns:
    float for a scalar input, else a float64 array of the input's shape.

  Raises:
    KeyError: no reference returns recorded for env_name.
    ValueError: R_random == R_expert.
  """
  lo, hi = reference_returns(env_name)
  if hi == lo:
    raise ValueError(f"reference returns of '{env_name}' are equal ({lo}); the score is undefined.")
  r = np.asarray(returns, np.float64)
  s = 100.0 * (r - lo) / (hi - lo)
  return float(s) if s.ndim == 0 else s


# --- collection -------------------------------------------------------------------------------------------------
def _to_dataset(tr: rollout_lib.Transition, num_transitions: int) -> dict[str, np.ndarray]:
  """Transition [T, B] -> env-major rows (each env's steps contiguous), a timeout at each env's last row."""
  tr = jax.device_get(tr)
  t, b = np.asarray(tr.reward).shape
  swap = lambda x: np.swapaxes(np.asarray(x), 0, 1).reshape((t * b,) + np.asarray(x).shape[2:])
  term = swap(tr.terminated).astype(bool)
  timeout = swap(tr.truncated).astype(bool)
  cut = np.zeros((b, t), bool)
  cut[:, -1] = True
  timeout = timeout | (cut.reshape(-1) & ~term)
  act = swap(tr.env_action)
  ds = {"observations": swap(tr.obs).astype(np.float32),
        "actions": act.astype(np.int32 if np.issubdtype(act.dtype, np.integer) else np.float32),
        "rewards": swap(tr.reward).astype(np.float32), "next_observations": swap(tr.next_obs).astype(np.float32),
        "terminals": term, "timeouts": timeout}
  if isinstance(tr.extras, dict) and "goal" in tr.extras:
    ds["goals"] = swap(tr.extras["goal"]).astype(np.float32)
  ds = {k: v[:num_transitions] for k, v in ds.items()}
  ds["timeouts"][-1] = not ds["terminals"][-1]
  return ds


def collect(env: envs_lib.Env, policy_fn: rollout_lib.PolicyFn, num_transitions: int, key: jax.Array,
            num_envs: int = 16) -> dict[str, np.ndarray]:
  """Rolls out a policy in `num_envs` environments until `num_transitions` rows exist.

  Args:
    env: the batched environment.
    policy_fn: rollout PolicyFn (key, obs [num_envs, D]) -> (raw action, env action, extras).
    num_transitions: N, rows kept (ceil(N / num_envs) steps are rolled out per env, then truncated).
    key: PRNG key (reset and rollout).
    num_envs: parallel environments.

  Returns:
    A data set dict (see module docstring), env-major with a timeout at the end of each env's segment;
    observations [N, D] float32, actions [N, A] float32 or [N] int32, rewards [N], terminals / timeouts [N] bool.
  """
  steps = math.ceil(num_transitions / num_envs)
  k_reset, k_roll = jax.random.split(key)

  @jax.jit
  def go(k_reset, k_roll):
    state = env.reset_batch(k_reset, num_envs)
    return rollout_lib.rollout(env, policy_fn, state, k_roll, steps)[1]

  return _to_dataset(go(k_reset, k_roll), num_transitions)


def collect_maze(env: maze_lib.PointMaze, num_transitions: int, key: jax.Array, noise_std: float = 0.3,
                 random_actions: bool = False, resample_goal: bool = True, num_envs: int = 16) -> dict[str, np.ndarray]:
  """Maze data: the waypoint controller (+ Gaussian noise) or uniform actions; new goal when one is reached.

  Rewards are the sparse reward w.r.t. the goal being pursued at that step (stored as 'goals').

  Args:
    env: the PointMaze.
    num_transitions: N, rows kept.
    key: PRNG key.
    noise_std: std of the controller's Gaussian action noise (a traced argument: no recompile per value).
    random_actions: uniform random actions instead of the controller.
    resample_goal: draw a new random goal each time the current one is reached.
    num_envs: parallel environments.

  Returns:
    A data set dict as `collect` returns, plus goals [N, 2] float32.
  """
  steps = math.ceil(num_transitions / num_envs)
  go = _maze_collector(env, steps, num_envs, bool(random_actions), bool(resample_goal))
  return _to_dataset(go(key, jnp.float32(noise_std)), num_transitions)


@functools.lru_cache(maxsize=16)   # one jitted function per static value: jit caches by function identity
def _maze_collector(env: maze_lib.PointMaze, steps: int, num_envs: int, random_actions: bool, resample_goal: bool):
  """The jitted maze data rollout (compiled once per env object and shape; the noise level is an argument)."""

  def one_step(state, k, noise_std):
    k_goal, k_noise, k_env = jax.random.split(k, 3)
    core = state.core
    reached = jnp.linalg.norm(core.pos - core.goal) <= env.goal_radius
    if resample_goal:
      core = core.replace(goal=jnp.where(reached, env.sample_cell(k_goal), core.goal))
    state = state.replace(core=core)
    if random_actions:
      a = jax.random.uniform(k_noise, (2,), minval=-1.0, maxval=1.0)
    else:
      a = maze_lib.waypoint_action(env, core.pos, core.vel, core.goal)
      a = jnp.clip(a + noise_std * jax.random.normal(k_noise, (2,)), -1.0, 1.0)
    new_state, ts = env.step(k_env, state, a)
    tr = rollout_lib.Transition(obs=state.obs, action=a, env_action=a, reward=ts.reward, terminated=ts.terminated,
                                truncated=ts.truncated, next_obs=ts.final_obs, episode_return=ts.episode_return,
                                episode_length=ts.episode_length, extras={"goal": core.goal})
    return new_state, tr

  @jax.jit
  def go(key, noise_std):
    k_reset, k_roll = jax.random.split(key)
    state = env.reset_batch(k_reset, num_envs)
    keys = jax.random.split(k_roll, steps * num_envs).reshape(steps, num_envs)
    return jax.lax.scan(lambda s, k: jax.vmap(lambda st, kk: one_step(st, kk, noise_std))(s, k), state, keys)[1]

  return go


# --- data agents (PPO with snapshots) -------------------------------------------------------------------------
def _flatten(tree: Any) -> dict[str, np.ndarray]:
  from flax import serialization, traverse_util
  flat = traverse_util.flatten_dict(serialization.to_state_dict(jax.device_get(tree)), sep="/")
  return {k: np.asarray(v) for k, v in flat.items()}


def _unflatten(template: Any, flat: dict[str, np.ndarray]) -> Any:
  from flax import serialization, traverse_util
  return serialization.from_state_dict(template, traverse_util.unflatten_dict(flat, sep="/"))


def _hash(obj: Any) -> str:
  return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def train_data_agent(env_name: str, seed: int = 0, cache_dir: str | os.PathLike | None = None,
                     num_chunks: int = 15, config: Any = None, progress: bool = True,
                     max_replay_rows: int = 200_000) -> dict[str, Any]:
  """Trains the PPO data agent of an environment in chunks, keeping a snapshot after each (cached).

  Args:
    env_name: the environment (AGENT_PRESETS names the preset its data agent uses).
    seed: the run's seed.
    cache_dir: where `<env>-agent-<hash>.npz` is cached (default `default_cache_dir()`).
    num_chunks: snapshots (the run's updates are split evenly; the last chunk takes the remainder).
    config: the data agent's PPO config (`iclr24_jax.configs.ppo.preset(AGENT_PRESETS[env_name])`).
    max_replay_rows: the replay keeps the rollout of every k-th update, k = ceil(all env steps / this).

  Returns:
    dict with 'agent' (ppo.PPO), 'params' (list of params per snapshot), 'obs_stats' (list), 'eval_returns'
    [num_chunks] (deterministic-policy evaluation, 16 episodes), 'env_steps' [num_chunks], 'replay' (a data set of
    the training rollouts, every k-th update's, with a 'chunk' column: the snapshot they precede), 'config' (dict).
  """
  from iclr24_jax.rl import ppo
  if config is None:
    hint = (f"iclr24_jax.configs.ppo.preset('{AGENT_PRESETS[env_name]}')" if env_name in AGENT_PRESETS
            else f"a PPO config (configs/ppo.py layout; presets exist for {sorted(AGENT_PRESETS)})")
    raise ValueError(f"the data agent of '{env_name}' needs its PPO config: pass config={hint}.")
  config = config.copy_and_resolve_references() if hasattr(config, "copy_and_resolve_references") else config
  agent = ppo.PPO(config)
  cfg_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  tag = _hash({"cfg": cfg_dict, "seed": seed, "chunks": num_chunks, "v": FORMAT_VERSION})
  cache = pathlib.Path(cache_dir) if cache_dir else default_cache_dir()
  path = cache / f"{env_name.replace('/', '_')}-agent-{tag}.npz"
  template = jax.eval_shape(agent.init, jax.random.key(seed))
  tmpl = {"params": template.train_state.params, "stats": template.train_state.extra}
  if path.exists():
    with np.load(path, allow_pickle=False) as z:
      meta = json.loads(str(z["meta"]))
      snaps = []
      for c in range(meta["num_chunks"]):
        flat = {k.split("/", 2)[2]: z[k] for k in z.files if k.startswith(f"snap/{c}/")}
        snaps.append(_unflatten(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), tmpl), flat))
      replay = {k[len("replay/"):]: z[k] for k in z.files if k.startswith("replay/")}
    return {"agent": agent, "params": [s["params"] for s in snaps], "obs_stats": [s["stats"] for s in snaps],
            "eval_returns": np.asarray(meta["eval_returns"]), "env_steps": np.asarray(meta["env_steps"]),
            "replay": replay, "config": cfg_dict, "path": str(path)}

  total = agent.num_updates
  sizes = [total // num_chunks] * num_chunks
  sizes[-1] += total - sum(sizes)
  if min(sizes) < 1:
    raise ValueError(f"train_data_agent: {total} updates cannot be split into {num_chunks} chunks.")
  batch = agent.num_envs * agent.rollout_steps
  replay_every = max(1, math.ceil(total * batch / max_replay_rows))
  chunk_fns = {n: jax.jit(lambda r, n=n: _chunk_with_trajectories(agent, r, n)) for n in set(sizes)}
  eval_fn = jax.jit(lambda p, s, k: agent.evaluate(p, s, k, num_envs=16, deterministic=True)["return"])
  runner = jax.jit(agent.init)(jax.random.key(seed))
  snaps, evals, steps, replays = [], [], [], []
  for c, n in enumerate(sizes):
    first_update = int(runner.update)
    runner, trs = chunk_fns[n](runner)
    trs = jax.device_get(trs)
    ts = runner.train_state
    evals.append(float(eval_fn(ts.params, ts.extra, jax.random.fold_in(jax.random.key(seed + 1), c))))
    steps.append(int(runner.update) * agent.num_envs * agent.rollout_steps)
    snaps.append(jax.device_get({"params": ts.params, "stats": ts.extra}))
    for i in range(n):  # every `replay_every`-th update's rollout joins the replay
      if (first_update + i) % replay_every == 0:
        part = _to_dataset(jax.tree.map(lambda x: x[i], trs), batch)
        part["chunk"] = np.full(len(part["rewards"]), c, np.int32)
        replays.append(part)
    if progress:
      print(f"[data agent {env_name}] chunk {c + 1}/{num_chunks}: {steps[-1]} env steps, eval return "
            f"{evals[-1]:.1f}", flush=True)
  replay = {k: np.concatenate([r[k] for r in replays]) for k in replays[0]}
  arrays = {}
  for c, s in enumerate(snaps):
    arrays.update({f"snap/{c}/{k}": v for k, v in _flatten(s).items()})
  arrays.update({f"replay/{k}": v for k, v in replay.items()})
  meta = {"env": env_name, "seed": seed, "num_chunks": num_chunks, "eval_returns": evals, "env_steps": steps,
          "config": cfg_dict, "replay_every": replay_every}
  save_npz(path, arrays, meta)
  return {"agent": agent, "params": [s["params"] for s in snaps], "obs_stats": [s["stats"] for s in snaps],
          "eval_returns": np.asarray(evals), "env_steps": np.asarray(steps), "replay": replay, "config": cfg_dict,
          "path": str(path)}


def _chunk_with_trajectories(agent, runner, n: int):
  """n updates in one scan, returning each update's rollout (Transition leaves [n, T, B, ...], no extras)."""

  def body(r, _):
    r, _, tr = agent.update_with_trajectory(r)
    return r, tr.replace(extras={})

  return jax.lax.scan(body, runner, None, length=n)


def _policy(agent, params, stats, deterministic=False):
  return agent.policy_fn(jax.tree.map(jnp.asarray, params), jax.tree.map(jnp.asarray, stats), deterministic)


@functools.lru_cache(maxsize=16)   # one jitted function per static value: jit caches by function identity
def _agent_collector(agent, steps: int, num_envs: int, deterministic: bool):
  """A jitted rollout of an agent's policy with params/statistics as arguments (compiled once per agent)."""

  @jax.jit
  def go(params, stats, key):
    k_reset, k_roll = jax.random.split(key)
    state = agent.env.reset_batch(k_reset, num_envs)
    return rollout_lib.rollout(agent.env, agent.policy_fn(params, stats, deterministic), state, k_roll, steps)[1]

  return go


def collect_agent(agent, params: Any, stats: Any, num_transitions: int, key: jax.Array, num_envs: int = 16,
                  deterministic: bool = False) -> dict[str, np.ndarray]:
  """`collect` for a PPO agent's policy at given params / observation statistics (one compile per agent).

  Args:
    agent: the PPO data agent (its env and policy_fn(params, stats, deterministic)).
    params: the policy parameters (host or device arrays).
    stats: its observation RunningStats.
    num_transitions: N, rows kept.
    key: PRNG key.
    num_envs: parallel environments.
    deterministic: act with the distribution's mode instead of sampling.

  Returns:
    A data set dict as `collect` returns.
  """
  steps = math.ceil(num_transitions / num_envs)
  go = _agent_collector(agent, steps, num_envs, deterministic)
  tr = go(jax.tree.map(jnp.asarray, params), jax.tree.map(jnp.asarray, stats), key)
  return _to_dataset(tr, num_transitions)


def _medium_index(eval_returns: np.ndarray, r_random: float, r_expert: float) -> int:
  target = r_random + (r_expert - r_random) / 3.0
  return int(np.argmin(np.abs(np.asarray(eval_returns) - target)))


# --- reference returns -----------------------------------------------------------------------------------------
def measure_reference_returns(env_name: str, seed: int = 0, num_episodes: int = 64,
                              cache_dir: str | os.PathLike | None = None, agent_seed: int = 0,
                              agent_config: Any = None) -> dict[str, Any]:
  """Measures R_random (uniform actions) and R_expert (the final data agent, stochastic, or the noise-free
  waypoint controller for mazes) as mean returns over `num_episodes` episodes of the evaluation env.

  Args:
    env_name: 'brax/<env>' (trains or loads the cached data agent) or 'maze/<layout>'.
    seed: evaluation seed (the rollout key is derived from seed + 1000).
    num_episodes: episodes per policy.
    cache_dir: cache folder of the data agent (None: the default).
    agent_seed: seed of the data agent.
    agent_config: the data agent's PPO config (brax: `configs.ppo.preset(AGENT_PRESETS[env_name])`).

  Returns:
    {'random', 'expert', 'random_std', 'expert_std', 'episodes', 'seed', 'how'}.
  """
  env = make_data_env(env_name)
  k_rand, k_exp = jax.random.split(jax.random.key(seed + 1000))
  rand = jax.jit(lambda k: rollout_lib.evaluate(env, rollout_lib.random_policy(env), k, num_episodes))(k_rand)
  if env_name.startswith("maze/"):
    pol = maze_lib.waypoint_policy(env)
    exp = jax.jit(lambda k: rollout_lib.evaluate(env, pol, k, num_episodes))(k_exp)
    how = "expert = noise-free waypoint controller"
  else:
    run = train_data_agent(env_name, agent_seed, cache_dir, config=agent_config)
    pol = _policy(run["agent"], run["params"][-1], run["obs_stats"][-1])
    exp = jax.jit(lambda k: rollout_lib.evaluate(env, pol, k, num_episodes))(k_exp)
    how = (f"expert = final PPO data agent (stochastic), {int(run['env_steps'][-1])} env steps, "
           f"agent seed {agent_seed}")
  return {"random": float(rand["return"]), "expert": float(exp["return"]), "random_std": float(rand["return_std"]),
          "expert_std": float(exp["return_std"]), "episodes": num_episodes, "seed": seed, "how": how}


@functools.lru_cache(maxsize=None)   # one Env object per name: programs jitted for it are reused
def make_data_env(env_name: str) -> envs_lib.Env:
  """The evaluation environment of a data set (mazes: fixed goal 'G', random start, sparse reward); one shared
  object per name, so jitted collectors are reused."""
  return envs_lib.make_env(env_name, **ENV_KWARGS.get(env_name, {}))


# --- the entry point ----------------------------------------------------------------------------------------------
def get_dataset(env_name: str, kind: str, num_transitions: int = 100_000, seed: int = 0,
                cache_dir: str | os.PathLike | None = None, agent_seed: int = 0, noise_std: float = 0.3,
                regenerate: bool = False, agent_config: Any = None) -> dict[str, np.ndarray]:
  """Generates (once, deterministically) and caches a D4RL-style data set, then loads it.

  Args:
    env_name: 'brax/inverted_pendulum', 'brax/hopper' (data agents in AGENT_PRESETS) or 'maze/<layout>'.
    kind: BRAX_KINDS for brax envs, MAZE_KINDS for mazes.
    num_transitions: rows (medium-replay: at most what the training produced; medium-expert: twice this).
    seed: data seed (the agent has its own `agent_seed`).
    cache_dir: default `default_cache_dir()`; files are `<env>-<kind>-n<N>-s<seed>-<hash>.npz`.
    noise_std: action noise of the maze 'noisy' controller.
    regenerate: ignore an existing cache file.
    agent_config: the data agent's PPO config, needed when a brax set is generated
      (`iclr24_jax.configs.ppo.preset(AGENT_PRESETS[env_name])`).

  Returns:
    The data set dict (validated). Generation prints progress and may train a PPO agent (minutes on CPU).
  """
  family = env_name.split("/", 1)[0]
  kinds = MAZE_KINDS if family == "maze" else BRAX_KINDS
  if kind not in kinds:
    raise ValueError(f"unknown data set kind '{kind}' for {env_name}; choose one of {kinds}.")
  if family not in ("maze", "brax", "gymnax"):
    raise ValueError(f"offline data sets exist for brax, gymnax and maze environments, not '{env_name}'.")
  if num_transitions < 1:
    raise ValueError(f"num_transitions must be >= 1, got {num_transitions}.")
  cache = pathlib.Path(cache_dir) if cache_dir else default_cache_dir()
  spec = {"env": env_name, "kind": kind, "n": num_transitions, "seed": seed, "agent_seed": agent_seed,
          "noise": noise_std if family == "maze" else None, "v": FORMAT_VERSION,
          "env_kwargs": ENV_KWARGS.get(env_name, {})}
  path = cache / f"{env_name.replace('/', '_')}-{kind}-n{num_transitions}-s{seed}-{_hash(spec)}.npz"
  if path.exists() and not regenerate:
    return load_dataset(path)
  key = jax.random.key(seed)
  env = make_data_env(env_name)
  if family == "maze":
    if kind == "random":
      ds = collect_maze(env, num_transitions, key, random_actions=True)
    elif kind == "noisy":
      ds = collect_maze(env, num_transitions, key, noise_std=noise_std)
    else:
      ds = collect_maze(env, num_transitions, key, noise_std=0.0, resample_goal=True)
  elif kind == "random":
    ds = collect(env, rollout_lib.random_policy(env), num_transitions, key)
  else:
    run = train_data_agent(env_name, agent_seed, cache, config=agent_config)
    agent = run["agent"]
    r_rand = float(jax.jit(lambda k: rollout_lib.evaluate(env, rollout_lib.random_policy(env), k, 16))(
        jax.random.key(seed + 7))["return"])
    mid = _medium_index(run["eval_returns"], r_rand, float(np.max(run["eval_returns"])))
    if kind == "medium":
      ds = collect_agent(agent, run["params"][mid], run["obs_stats"][mid], num_transitions, key)
    elif kind == "expert":
      ds = collect_agent(agent, run["params"][-1], run["obs_stats"][-1], num_transitions, key)
    elif kind == "medium-expert":
      k1, k2 = jax.random.split(key)
      a = collect_agent(agent, run["params"][mid], run["obs_stats"][mid], num_transitions, k1)
      b = collect_agent(agent, run["params"][-1], run["obs_stats"][-1], num_transitions, k2)
      ds = {k: np.concatenate([a[k], b[k]]) for k in a}
    else:  # medium-replay
      rep = run["replay"]
      rows = np.nonzero(rep["chunk"] <= mid)[0][-num_transitions:]
      ds = {k: v[rows] for k, v in rep.items() if k != "chunk"}
      ds["timeouts"][-1] = not ds["terminals"][-1]
  validate_dataset(ds)
  save_npz(path, ds, spec)
  return ds


def main(argv: list[str] | None = None) -> int:
  """`python -m iclr24_jax.rl.offline [--measure] ENV...`: generate data sets / measure reference returns."""
  import argparse
  ap = argparse.ArgumentParser(description=main.__doc__)
  ap.add_argument("envs", nargs="+")
  ap.add_argument("--measure", action="store_true", help="measure reference returns and update the JSON table")
  ap.add_argument("--kinds", default="")
  ap.add_argument("--n", type=int, default=100_000)
  ap.add_argument("--cache_dir", default=None)
  args = ap.parse_args(argv)
  # A command line is a runner: it loads the data agents' presets (configs are data the library never imports).
  import importlib
  presets = importlib.import_module("iclr24_jax.configs.ppo").preset
  for env_name in args.envs:
    agent = presets(AGENT_PRESETS[env_name]) if env_name in AGENT_PRESETS else None
    if args.measure:
      ref = measure_reference_returns(env_name, cache_dir=args.cache_dir, agent_config=agent)
      table = reference_table()
      table[env_name] = {**table.get(env_name, {}), **ref}
      with open(REFERENCE_FILE, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
      print(env_name, ref, flush=True)
    kinds = [k for k in args.kinds.split(",") if k]
    for kind in kinds:
      ds = get_dataset(env_name, kind, args.n, cache_dir=args.cache_dir, agent_config=agent)
      rets = episode_returns(ds, complete_only=True)
      print(f"{env_name} {kind}: {len(ds['rewards'])} rows, {len(rets)} episodes, mean return "
            f"{rets.mean() if len(rets) else float('nan'):.1f}", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
