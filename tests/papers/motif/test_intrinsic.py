"""Motif intrinsic reward (`papers/motif/intrinsic.py`): normalisation by hand, thresholds, count decay, episode
counters, the reward hook."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import motif
from iclr24_jax.papers.motif import intrinsic


def test_fit_normalisation_hand_computed():
  mu, sigma, q = motif.fit_normalisation([1.0, 2.0, 3.0, 4.0], levels=(0.0, 0.5, 1.0))
  # mu = 2.5, sigma = sqrt(((1.5^2 + 0.5^2) * 2) / 4) = sqrt(1.25) = 1.118034; extremes +-1.5 / 1.118 = +-1.341641
  np.testing.assert_allclose([mu, sigma], [2.5, 1.118034], rtol=1e-6)
  np.testing.assert_allclose(q, [-1.341641, 0.0, 1.341641], rtol=1e-5)
  mu_w, sigma_w, _ = motif.fit_normalisation([1.0, 2.0, 3.0, 4.0], weights=[2, 0, 0, 2])
  np.testing.assert_allclose([mu_w, sigma_w], [2.5, 1.5], rtol=1e-6)
  assert len(motif.fit_normalisation(np.arange(10.0))[2]) == 19          # the official 0.05 ... 0.95 grid
  with pytest.raises(ValueError, match="constant"):
    motif.fit_normalisation([2.0, 2.0])
  with pytest.raises(ValueError, match="finite"):
    motif.fit_normalisation([1.0, np.nan])


def test_threshold_any_quantile():
  x = np.arange(11.0)
  assert intrinsic.threshold(x, 0.37) == pytest.approx(3.7)   # not one of the saved quantiles: no crash
  assert intrinsic.threshold(x, None) == float("-inf")
  with pytest.raises(ValueError, match="quantile"):
    intrinsic.threshold(x, 1.5)


def test_intrinsic_reward_threshold_and_count_decay():
  r = jnp.array([3.0, 1.0, 2.5, 2.0, 3.0])
  counts = jnp.array([1, 1, 2, 1, 3])
  out = jax.jit(motif.intrinsic_reward)(r, 1.0, 2.0, 0.5, counts, 3.0)
  # r_hat = (r - 1) / 2 = [1, 0, 0.75, 0.5, 1]; r_hat > 0.5 strictly -> [1, 0, 0.75, 0, 1]
  # / counts^3 = [1, 1, 8, 1, 27] -> [1, 0, 0.09375, 0, 0.037037]
  np.testing.assert_allclose(out, [1.0, 0.0, 0.09375, 0.0, 1.0 / 27], rtol=1e-6)
  np.testing.assert_allclose(motif.intrinsic_reward(r, 1.0, 2.0, -np.inf, jnp.ones(5), 3.0)[1], 0.0)
  np.testing.assert_allclose(motif.combine_rewards(jnp.array([2.0]), jnp.array([3.0]), 0.1, 0.5), [1.7], rtol=1e-6)
  with pytest.raises(ValueError, match="same shape"):
    motif.intrinsic_reward(r, 0.0, 1.0, 0.0, jnp.ones(3))


def test_episode_counter_resets_on_done():
  c = motif.EpisodeMessageCounter(2)
  counts = c.update([["a", "a"], ["a", "b"], ["a", "a"]], np.array([[0, 1], [0, 0], [0, 0]], bool))
  np.testing.assert_array_equal(counts, [[1, 1], [2, 1], [3, 1]])
  np.testing.assert_array_equal(c.update([["a", "a"]], np.array([[1, 0]], bool)), [[4, 2]])   # persists
  np.testing.assert_array_equal(c.update([["a", "a"]], np.zeros((1, 2), bool)), [[1, 3]])
  with pytest.raises(ValueError, match="done"):
    c.update([["a", "a"]], np.zeros((2, 2), bool))


def test_motif_reward_hook_batches():
  calls = []

  def reward_fn(msgs):
    calls.append(len(msgs))
    return msgs[:, 0].astype(np.float64) - 65.0           # 'A' -> 0, 'B' -> 1, 'C' -> 2

  def buf(ch):
    b = np.zeros(256, np.uint8)
    b[0] = ord(ch)
    return b

  msgs = np.stack([[buf("C"), buf("B")], [buf("C"), buf("A")]])            # [T=2, N=2, 256]
  batch = {"next_obs": {"message": msgs}, "obs": {"message": msgs}, "reward": np.array([[1.0, 0], [0, 0]]),
           "terminated": np.array([[False, True], [False, False]]), "truncated": np.zeros((2, 2), bool)}
  hook = motif.MotifRewardHook(reward_fn, mu=0.0, sigma=1.0, eps=0.5, num_envs=2, beta=3.0, alpha_ext=0.5,
                               alpha_int=1.0)
  out = hook(batch)
  # env 0: C (r_hat 2, count 1) then C again (count 2 -> 2 / 8); env 1: B (1, count 1), episode ends, A (0 <= eps)
  np.testing.assert_allclose(out, [[0.5 * 1 + 2.0, 1.0], [2.0 / 8, 0.0]], rtol=1e-6)
  assert sum(calls) == 3                                      # three distinct messages, each scored once
  out2 = hook(batch)                                          # counts persist across batches: C is now 3rd, 4th
  np.testing.assert_allclose(out2[:, 0], [0.5 + 2.0 / 27, 2.0 / 64], rtol=1e-6)
  assert sum(calls) == 3                                      # cached
  with pytest.raises(ValueError, match="source"):
    motif.MotifRewardHook(reward_fn, 0.0, 1.0, 0.0, 2, source="state")


def test_motif_reward_hook_state_round_trip():
  """get_state -> JSON -> set_state on a fresh hook: the next batch gets the same rewards from the saved counts and
  the saved r_phi cache (reward_fn is not called again), also for a buffer with bytes after its NUL."""
  import json
  calls = []

  def reward_fn(msgs):
    calls.append(len(msgs))
    return msgs[:, 0].astype(np.float64) - 65.0           # 'A' -> 0, 'B' -> 1, 'C' -> 2

  def buf(ch, tail=b""):
    b = np.zeros(256, np.uint8)
    b[0] = ord(ch)
    b[2:2 + len(tail)] = np.frombuffer(tail, np.uint8)     # bytes after the terminating NUL
    return b

  msgs = np.stack([[buf("C"), buf("B", b"\xe9x")], [buf("C"), buf("B", b"\xe9x")]])    # [T=2, N=2, 256]
  batch = {"next_obs": {"message": msgs}, "obs": {"message": msgs}, "reward": np.zeros((2, 2)),
           "terminated": np.zeros((2, 2), bool), "truncated": np.zeros((2, 2), bool)}
  kw = dict(mu=0.0, sigma=1.0, eps=0.5, num_envs=2, beta=3.0, alpha_ext=0.5, alpha_int=1.0)
  hook = motif.MotifRewardHook(reward_fn, **kw)
  hook(batch)                                               # counts: env 0 C: 2, env 1 B-with-tail: 2
  saved = json.loads(json.dumps(hook.get_state()))
  assert saved["length"] == 256 and [sorted(v for _, v in c) for c in saved["counts"]] == [[2], [2]]
  resumed = motif.MotifRewardHook(reward_fn, **kw)
  resumed.set_state(saved)
  n_calls = sum(calls)
  out = resumed(batch)
  # third and fourth occurrences: env 0 C (r_hat 2) -> 2 / 27, 2 / 64; env 1 B (r_hat 1) -> 1 / 27, 1 / 64
  np.testing.assert_allclose(out, [[2.0 / 27, 1.0 / 27], [2.0 / 64, 1.0 / 64]], rtol=1e-6)
  np.testing.assert_allclose(out, hook(batch), rtol=0)     # the uninterrupted hook's next batch
  assert sum(calls) == n_calls                              # both messages came from the restored cache
  with pytest.raises(ValueError, match="counts for 2 environments; this hook has 3"):
    motif.MotifRewardHook(reward_fn, **dict(kw, num_envs=3)).set_state(saved)
