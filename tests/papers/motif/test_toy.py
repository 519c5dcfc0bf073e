"""Motif toy world (`papers/motif/toy.py`): events, counts, the oracle, the closed-form reward, a scripted agent."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import motif
from iclr24_jax.papers.motif import toy
from iclr24_jax.rl import ppo
from iclr24_jax.rl import rollout as rollout_lib
from .helpers import _official_total_reward


def test_toy_events_counts_and_oracle():
  env = toy.CaptionedGridWorld(height=5, width=9, max_episode_steps=20)       # door at (2, 4)
  step = jax.jit(env.step_core)
  base = toy.GridState(pos=jnp.array([2, 3]), key=jnp.array([0, 0]), goal=jnp.array([2, 6]),
                       has_key=jnp.array(False), door_open=jnp.array(False), caption=jnp.array(0),
                       counts=jnp.zeros(toy.NUM_CAPTIONS, jnp.int32))
  event = lambda s: toy.EVENTS[toy.CAPTION_EVENT[int(s.caption)]]
  k = jax.random.key(0)
  s, _, r, term = step(k, base, 3)                                             # right, into the closed door
  assert event(s) == "locked" and s.pos.tolist() == [2, 3] and not term
  s, _, _, _ = step(k, base.replace(has_key=jnp.array(True)), 3)              # with the key: unlock, step in
  assert event(s) == "unlock" and s.pos.tolist() == [2, 4] and bool(s.door_open)
  s2, obs, r, term = step(k, s, 3)                                             # on into the right room
  s3, obs, r, term = step(k, s2, 3)                                            # reaches the goal at (2, 6)
  assert event(s3) == "goal" and float(r) == 1.0 and bool(term)
  s, _, _, _ = step(k, base.replace(pos=jnp.array([1, 3])), 3)                 # the wall column
  assert event(s) == "bump" and s.pos.tolist() == [1, 3]
  s, _, _, _ = step(k, base.replace(pos=jnp.array([0, 1])), 2)                 # onto the key at (0, 0)
  assert event(s) == "key" and bool(s.has_key)
  s_b, obs_b, _, _ = step(k, base.replace(pos=jnp.array([0, 2])), 0)           # border, twice
  s_b, obs_b, _, _ = step(k, s_b, 0)
  cap, cnt = toy.caption_and_count(obs_b, 20)
  assert int(cnt) == 2 and toy.EVENTS[toy.CAPTION_EVENT[int(cap)]] == "bump"
  assert toy.oracle_preference("You found the treasure!", "You pick up a brass key.") == 0
  assert toy.oracle_preference("You bump into a wall.", "") == 1
  assert toy.oracle_preference("You hear a distant noise.", "") == 2
  with pytest.raises(ValueError, match="not a caption"):
    toy.oracle_preference("You kill the newt!", "")
  with pytest.raises(ValueError, match="odd width"):
    toy.CaptionedGridWorld(height=5, width=8)


def test_toy_reward_fn_closed_form():
  env = toy.CaptionedGridWorld(height=5, width=9, max_episode_steps=20)
  table = jnp.arange(toy.NUM_CAPTIONS, dtype=jnp.float32)                     # r_phi(caption i) = i
  fn = motif.toy_reward_fn(table, mu=1.0, sigma=2.0, eps=0.0, alpha_ext=10.0, alpha_int=1.0, beta=3.0,
                           max_episode_steps=20)
  goal_cap = int(toy.EVENT_OFFSET[toy.EVENTS.index("goal")])
  s = toy.GridState(pos=jnp.array([2, 6]), key=jnp.array([0, 0]), goal=jnp.array([2, 6]), has_key=jnp.array(True),
                    door_open=jnp.array(True), caption=jnp.array(goal_cap),
                    counts=jnp.zeros(toy.NUM_CAPTIONS, jnp.int32).at[goal_cap].set(2))
  obs = jax.jit(env.observe)(s)[None, None]
  tr = rollout_lib.Transition(obs=obs, action=jnp.zeros((1, 1), jnp.int32), env_action=jnp.zeros((1, 1)),
                              reward=jnp.ones((1, 1)), terminated=jnp.ones((1, 1), bool),
                              truncated=jnp.zeros((1, 1), bool), next_obs=obs, episode_return=jnp.zeros((1, 1)),
                              episode_length=jnp.zeros((1, 1)), extras={})
  # r_hat = (goal_cap - 1) / 2, count 2 -> / 8; plus 10 * r_ext
  np.testing.assert_allclose(jax.jit(fn)(tr), [[10.0 + (goal_cap - 1) / 2 / 8]], rtol=1e-6)
  # Through the PPO's reward processing with reward_scale 0.1 (the staircase_weights variant): the official
  # formula scales only the goal reward, 10 * 0.1 * 1 + 1 * r_int.
  got = jax.jit(lambda t: ppo.process_reward(t, 0.1, 0.0, fn))(tr)
  ref = _official_total_reward([[1.0]], [[goal_cap]], [[2]], mu=1.0, var=4.0, eps=0.0, reward_scale=0.1,
                               reward_clip=np.inf, extrinsic_reward=10.0, llm_reward=1.0, beta=3.0)
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  np.testing.assert_allclose(got, [[1.0 + (goal_cap - 1) / 2 / 8]], rtol=1e-6)


def test_scripted_agent_solves_toy():
  env = toy.CaptionedGridWorld(height=5, width=9, max_episode_steps=30)
  stats = jax.jit(lambda k: toy.episode_stats(env, toy.scripted_policy(env, 0.0), k, 16))(jax.random.key(0))
  assert float(stats["success"]) == 1.0 and float(stats["bumps"]) == 0.0
  assert float(stats["key"]) == 1.0 and float(stats["unlock"]) == 1.0
