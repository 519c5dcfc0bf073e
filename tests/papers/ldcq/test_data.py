"""LDCQ data (`papers/ldcq/data.py`): segments respect episode ends, discounted reward sums, maze relabelling."""
import chex
import numpy as np

from iclr24_jax.papers.ldcq import data as data_lib


def test_segments_respect_episode_ends():
  n = 12
  ds = {"observations": np.arange(n, dtype=np.float32)[:, None].repeat(2, 1),
        "actions": np.ones((n, 2), np.float32), "rewards": np.arange(n, dtype=np.float32),
        "next_observations": np.arange(1, n + 1, dtype=np.float32)[:, None].repeat(2, 1),
        "terminals": np.zeros(n, bool), "timeouts": np.zeros(n, bool)}
  ds["timeouts"][4] = True
  ds["terminals"][9] = True
  ds["timeouts"][11] = True
  # windows t..t+2 with no episode end at rows t, t+1 (an end at the last row is allowed)
  np.testing.assert_array_equal(data_lib.segment_starts(ds, 3), [0, 1, 2, 5, 6, 7])
  seg = data_lib.make_segments(ds, 3, gamma=0.5)
  chex.assert_shape(seg["states"], (6, 3, 2))
  # reward_sum of the window at 7: 7 + 0.5 * 8 + 0.25 * 9 = 13.25; it ends in the terminal at row 9
  np.testing.assert_allclose(seg["reward_sum"][-1], 13.25)
  np.testing.assert_array_equal(seg["done"], [0, 0, 0, 0, 0, 1])
  np.testing.assert_allclose(seg["next_state"][:, 0], [3, 4, 5, 8, 9, 10])  # s_H = next obs of the last row
  # maze relabelling: reward 1 within the radius of the evaluation goal
  rel = data_lib.relabel_maze_rewards(ds, goal=[5.0, 5.0], goal_radius=0.5)
  np.testing.assert_array_equal(np.nonzero(rel["rewards"])[0], [4])
