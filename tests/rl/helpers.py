"""Shared by the RL family's test modules: the tiny CartPole PPO config, 8 envs for the 8 simulated devices."""
from iclr24_jax.configs import ppo as ppo_config


def _tiny(**ppo_overrides):
  c = ppo_config.get_config("tiny")
  c.num_steps = 3
  c.ppo.num_envs = 8  # divisible by the 8 simulated devices
  c.ppo.update(ppo_overrides)
  return c
