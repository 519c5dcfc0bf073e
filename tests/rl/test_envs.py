"""Environment interface (`rl/envs.py`): the gymnax adapter's spec, auto-reset and time limit; clear errors."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.rl import envs


def test_gymnax_spec_and_reset(cartpole):
  assert cartpole.spec.discrete and cartpole.spec.action_dim == 2 and cartpole.spec.obs_shape == (4,)
  st = cartpole.reset_batch(jax.random.key(0), 3)
  chex.assert_shape(st.obs, (3, 4))
  chex.assert_type(st.obs, jnp.float32)


def test_time_limit_truncates_and_resets(cartpole):
  # Pushing alternately keeps the pole up for 5 steps: the 5th step is truncated (not terminated), the
  # returned obs is a fresh reset while final_obs is the state reached, and the stats record 5 steps.
  st = cartpole.reset(jax.random.key(1))
  step = jax.jit(cartpole.step)
  for t in range(5):
    st, ts = step(jax.random.key(10 + t), st, jnp.asarray(t % 2))
  assert bool(ts.truncated) and not bool(ts.terminated)
  assert float(ts.episode_return) == 5.0 and int(ts.episode_length) == 5
  assert int(st.step_count) == 0 and int(st.episodes) == 1 and float(st.last_return) == 5.0
  assert not np.allclose(ts.obs, ts.final_obs)


def test_make_env_errors():
  with pytest.raises(ValueError, match="family/id"):
    envs.make_env("CartPole-v1")
  with pytest.raises(ValueError, match="unknown environment family"):
    envs.make_env("atari/Pong")
  with pytest.raises(ValueError, match="unknown brax environment"):
    envs.make_env("brax/cheetah")
