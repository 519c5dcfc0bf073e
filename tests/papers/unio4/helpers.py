"""Helpers shared by the Uni-O4 test modules."""
import math

import jax.numpy as jnp

from iclr24_jax.papers import unio4


def _const_policy_params(means, log_stds, obs_dim=1):
  """GaussianPolicy(action_dim=1, hidden=(2,)) params whose output is constant: zero kernels, last bias set so
  tanh(bias) = (mean, (log_std + 5) / 2.5 - 1) (log_std bounds (-5, 0))."""
  out = []
  for m, s in zip(means, log_stds):
    t = (s + 5.0) / 2.5 - 1.0
    out.append({"MLP_0": {"Dense_0": {"kernel": jnp.zeros((obs_dim, 2)), "bias": jnp.zeros((2,))},
                          "Dense_1": {"kernel": jnp.zeros((2, 2)),
                                      "bias": jnp.asarray([math.atanh(m), math.atanh(t)], jnp.float32)}}})
  return out


def _random_ensemble(key, k=3, obs_dim=3, action_dim=2, hidden=(16, 16), identical=False):
  policy = unio4.GaussianPolicy(action_dim, hidden)
  return policy, unio4.init_ensemble(key, policy, k, jnp.zeros((1, obs_dim)), identical=identical)
