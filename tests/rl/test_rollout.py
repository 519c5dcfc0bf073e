"""Rollouts (`rl/rollout.py`): shapes and episode statistics on CartPole."""
import chex
import jax
import numpy as np

from iclr24_jax.rl import rollout


def test_rollout_shapes_and_stats(cartpole):
  st = cartpole.reset_batch(jax.random.key(0), 4)
  st, tr = jax.jit(lambda s, k: rollout.rollout(cartpole, rollout.random_policy(cartpole), s, k, 12))(
      st, jax.random.key(1))
  chex.assert_shape(tr.obs, (12, 4, 4))
  chex.assert_shape(tr.reward, (12, 4))
  # every env finishes at least 2 episodes of <= 5 steps in 12 steps; the episode returns are their lengths
  assert np.all(np.asarray(st.episodes) >= 2)
  done = np.asarray(tr.done)
  np.testing.assert_array_equal(np.asarray(tr.episode_return)[done], np.asarray(tr.episode_length)[done])
