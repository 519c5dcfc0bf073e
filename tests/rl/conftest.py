"""Fixtures shared by the RL family's test modules."""
import pytest

from iclr24_jax.rl import envs


@pytest.fixture(scope="module")
def cartpole():
  return envs.make_env("gymnax/CartPole-v1", max_episode_steps=5)
