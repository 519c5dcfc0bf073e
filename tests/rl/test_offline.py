"""Offline data sets: the D4RL format, deterministic generation with a cache, loading, normalised scores."""
import os

import jax
import numpy as np
import pytest

from iclr24_jax.rl import offline, replay


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return tmp_path_factory.mktemp("rl_cache")


@pytest.fixture(scope="module")
def noisy(cache):
  return offline.get_dataset("maze/umaze", "noisy", 2_000, seed=0, cache_dir=cache)


def test_maze_dataset_format(noisy):
  ds = noisy
  assert set(offline.REQUIRED_KEYS) <= set(ds)
  n = 2_000
  assert ds["observations"].shape == (n, 4) and ds["actions"].shape == (n, 2) and ds["goals"].shape == (n, 2)
  assert ds["terminals"].dtype == bool and not ds["terminals"].any()  # maze2d never terminates
  assert np.all(np.abs(ds["actions"]) <= 1.0)
  # inside an episode the next observation is the following row's observation
  inside = ~(ds["timeouts"] | ds["terminals"])[:-1]
  np.testing.assert_array_equal(ds["next_observations"][:-1][inside], ds["observations"][1:][inside])
  # the sparse reward is 1 exactly when the mass ends the step within 0.5 of the pursued goal
  near = np.linalg.norm(ds["next_observations"][:, :2] - ds["goals"], axis=1) <= 0.5
  np.testing.assert_array_equal(ds["rewards"] == 1.0, near)
  assert ds["rewards"].sum() > 0


def test_generation_is_deterministic_and_cached(cache, noisy):
  files = sorted(os.listdir(cache))
  again = offline.get_dataset("maze/umaze", "noisy", 2_000, seed=0, cache_dir=cache)  # from the cache
  assert sorted(os.listdir(cache)) == files
  fresh = offline.get_dataset("maze/umaze", "noisy", 2_000, seed=0, cache_dir=cache, regenerate=True)
  for k in offline.REQUIRED_KEYS:
    np.testing.assert_array_equal(again[k], noisy[k])
    np.testing.assert_array_equal(fresh[k], noisy[k])
  other = offline.get_dataset("maze/umaze", "random", 2_000, seed=0, cache_dir=cache)
  # random actions reach the goal less often than the noisy controller
  assert other["rewards"].mean() < noisy["rewards"].mean()


def test_npz_round_trip_and_d4rl_without_next_observations(tmp_path, noisy):
  path = offline.save_npz(tmp_path / "d.npz", noisy, meta={"note": "test"})
  back = offline.load_dataset(path)
  for k in offline.REQUIRED_KEYS:
    np.testing.assert_array_equal(back[k], noisy[k])
  # a D4RL file without next_observations: rebuilt from the next row, rows at timeouts dropped
  raw = {k: noisy[k] for k in ("observations", "actions", "rewards", "terminals", "timeouts")}
  np.savez(tmp_path / "raw.npz", **raw)
  rebuilt = offline.load_dataset(tmp_path / "raw.npz")
  keep = ~noisy["timeouts"]
  keep[-1] = False
  assert len(rebuilt["observations"]) == keep.sum()
  np.testing.assert_array_equal(rebuilt["next_observations"], noisy["observations"][1:][keep[:-1]])


def test_dataset_errors(tmp_path, noisy):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    offline.load_dataset(tmp_path / "missing.npz")
  bad = dict(noisy)
  del bad["rewards"]
  with pytest.raises(ValueError, match="lacks"):
    offline.validate_dataset(bad)
  bad = dict(noisy, rewards=noisy["rewards"][:-1])
  with pytest.raises(ValueError, match="differ in length"):
    offline.validate_dataset(bad)
  bad = dict(noisy, observations=np.full_like(noisy["observations"], np.nan))
  with pytest.raises(ValueError, match="NaN"):
    offline.validate_dataset(bad)
  with pytest.raises(ValueError, match="unknown data set kind"):
    offline.get_dataset("maze/umaze", "medium")


def test_episode_returns_and_normalized_score():
  ds = {"rewards": np.array([1.0, 2.0, 3.0, 4.0, 5.0]), "terminals": np.array([0, 1, 0, 0, 0], bool),
        "timeouts": np.array([0, 0, 0, 1, 0], bool)}
  np.testing.assert_allclose(offline.episode_returns(ds), [3.0, 7.0, 5.0])
  np.testing.assert_allclose(offline.episode_returns(ds, complete_only=True), [3.0, 7.0])
  # D4RL's own hopper references: random -20.272305, expert 3234.3 -> 100 * (1607.0139 + 20.272305) / 3254.572305 = 50
  np.testing.assert_allclose(offline.normalized_score("d4rl/hopper", 1607.0139), 50.0, atol=1e-3)
  lo, hi = offline.reference_returns("maze/umaze")
  np.testing.assert_allclose(offline.normalized_score("maze/umaze", [lo, hi]), [0.0, 100.0], atol=1e-9)
  with pytest.raises(KeyError, match="no reference returns"):
    offline.reference_returns("brax/humanoid")


def test_dataset_into_replay_buffer(noisy):
  batch = offline.to_jax_batch({k: noisy[k] for k in offline.REQUIRED_KEYS})
  buf = replay.uniform_init(jax.tree.map(lambda x: x[0], batch), capacity=4096)
  buf = replay.uniform_add(buf, batch)
  sample = replay.uniform_sample(buf, jax.random.key(0), 32)
  assert sample["observations"].shape == (32, 4) and int(buf.size) == 2_000


@pytest.mark.slow
def test_brax_inverted_pendulum_datasets(cache):
  from iclr24_jax.configs import ppo as ppo_config
  cfg = ppo_config.preset("inverted_pendulum")
  run = offline.train_data_agent("brax/inverted_pendulum", 0, cache, num_chunks=5, config=cfg, progress=False)
  assert len(run["params"]) == 5 and run["eval_returns"][-1] > run["eval_returns"][0]
  again = offline.train_data_agent("brax/inverted_pendulum", 0, cache, num_chunks=5, config=cfg, progress=False)
  np.testing.assert_array_equal(again["eval_returns"], run["eval_returns"])  # from the cache
  assert again["replay"]["observations"].shape[1] == 4
