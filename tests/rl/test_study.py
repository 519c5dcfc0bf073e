"""The RL study (`rl/study.py`, slow): CartPole solved."""
import os

import pytest

from iclr24_jax.configs import ppo as ppo_config


@pytest.mark.slow
def test_cartpole_solved():
  from iclr24_jax.rl import study
  row = study._cartpole(os.environ.get("TMPDIR", "/tmp"), fast=False, get_config=ppo_config.get_config)
  assert row["ours"] >= study.CARTPOLE_THRESHOLD, row
