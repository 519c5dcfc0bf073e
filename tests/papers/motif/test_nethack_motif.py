"""Motif on NetHack (`papers/motif/nethack_motif.py`): the host PPO reward is the official formula."""
import numpy as np
import pytest

from iclr24_jax.papers import motif
from .helpers import _official_total_reward


class _FakeVecEnv:
  num_envs = 2


@pytest.mark.parametrize("variant, extrinsic_reward, llm_reward", [("nethack", 0.1, 0.1),
                                                                    ("nethack,staircase_weights", 10.0, 0.1)])
def test_host_ppo_reward_is_the_official_formula(variant, extrinsic_reward, llm_reward):
  from iclr24_jax.configs import motif as cfg_mod
  from iclr24_jax.papers.motif import nethack_motif
  from iclr24_jax.rl import ppo_host
  c = cfg_mod.get_config(variant)
  agent_cfg = nethack_motif.agent_config(c)
  assert (agent_cfg.ppo.reward_scale, agent_cfg.ppo.reward_clip) == (0.1, 10.0)   # official run's values
  alpha_ext, alpha_int = ((c.intrinsic.alpha_ext, c.intrinsic.alpha_int) if "staircase" in variant
                          else (c.nethack.alpha_ext, c.nethack.alpha_int))
  assert (alpha_ext, alpha_int) == (extrinsic_reward, llm_reward)

  def buf(ch):
    b = np.zeros(256, np.uint8)
    b[0] = ord(ch)
    return b

  msgs = np.stack([[buf("C"), buf("B")], [buf("C"), buf("A")]])            # r_phi: C 2, B 1, A 0
  r_env = np.array([[150.0, -3.0], [20.0, 0.0]], np.float32)               # 150 * 0.1 = 15 is clipped to 10
  batch = {"next_obs": {"message": msgs}, "obs": {"message": msgs}, "reward": r_env,
           "terminated": np.array([[False, True], [False, False]]), "truncated": np.zeros((2, 2), bool)}
  hook = motif.MotifRewardHook(lambda m: m[:, 0].astype(np.float64) - 65.0, mu=0.5, sigma=1.5, eps=0.1,
                               num_envs=2, beta=3.0, alpha_ext=alpha_ext, alpha_int=alpha_int)
  agent = ppo_host.HostPPO(agent_cfg, _FakeVecEnv(), model=None, reward_hook=hook)
  got = agent.rewards(batch)
  # counts: env 0 sees C twice (1, 2); env 1 sees B, its episode ends, then A (1, 1)
  ref = _official_total_reward(r_env, [[2.0, 1.0], [2.0, 0.0]], [[1, 1], [2, 1]], mu=0.5, var=1.5 ** 2, eps=0.1,
                               reward_scale=0.1, reward_clip=10.0, extrinsic_reward=extrinsic_reward,
                               llm_reward=llm_reward, beta=3.0)
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  # by hand (NetHackScore weights): 0.1 * clip(15) + 0.1 * 1 = 1.1; 0.1 * -0.3 + 0.1 * (1 / 3) = 0.003333;
  # 0.1 * 2 + 0.1 * 1 / 8 = 0.2125; A: r_hat -1/3 <= eps -> 0
  if variant == "nethack":
    np.testing.assert_allclose(got, [[1.1, 0.0033333], [0.2125, 0.0]], rtol=1e-4, atol=1e-7)
  no_hook = ppo_host.HostPPO(agent_cfg, _FakeVecEnv(), model=None)
  np.testing.assert_allclose(no_hook.rewards(batch), [[10.0, -0.3], [2.0, 0.0]], rtol=1e-6)
