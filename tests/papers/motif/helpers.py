"""Helpers shared by the Motif test modules."""
import numpy as np


def _official_total_reward(r_env, r_phi, counts, mu, var, eps, reward_scale, reward_clip, extrinsic_reward,
                           llm_reward, beta):
  """numpy reference of the official Motif reward: sample-factory actor_worker.py:458-459 scales and clips the
  game reward; learner.py:782-793 normalises r_phi, thresholds it, divides by count^beta and adds it unscaled."""
  r_ext = np.clip(np.asarray(r_env) * reward_scale, -reward_clip, reward_clip)
  llm = (np.asarray(r_phi) - mu) / var ** 0.5
  llm = (llm > eps) * llm
  return extrinsic_reward * r_ext + llm_reward * llm * (1.0 / np.asarray(counts, np.float64) ** beta)
