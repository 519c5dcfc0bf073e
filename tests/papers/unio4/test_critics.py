"""Uni-O4 value fitting (`papers/unio4/critics.py`): SARSA and IQL critics recover the known values of a chain."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import unio4


def _chain_dataset(episodes=40, length=10):
  """A deterministic chain: state t / length, one action (0), reward 1, terminal at the last step."""
  t = np.tile(np.arange(length), episodes)
  obs = (t / length).astype(np.float32)[:, None]
  nxt = ((t + 1) / length).astype(np.float32)[:, None]
  return {"observations": obs, "actions": np.zeros((len(t), 1), np.float32), "rewards": np.ones(len(t), np.float32),
          "next_observations": nxt, "terminals": t == length - 1, "timeouts": np.zeros(len(t), bool)}


@pytest.mark.parametrize("mode", ["sarsa", "iql"])
def test_value_fitting_recovers_known_values_on_a_chain(mode):
  gamma, length = 0.9, 10
  data = unio4.prepare(_chain_dataset(length=length), gamma=gamma)
  cfg = dict(mode=mode, v_hidden=(64, 64), q_hidden=(64, 64), activation="relu", double_q=True, v_lr=3e-3,
             q_lr=3e-3, batch_size=128, num_steps=1500, gamma=gamma, tau=0.2, target_update_freq=1, expectile=0.7)
  critics, hist = unio4.fit_value_functions(jax.random.key(0), data, cfg, log_every=500)
  s = jnp.asarray((np.arange(length) / length)[:, None], jnp.float32)
  true = (1 - gamma ** (length - np.arange(length))) / (1 - gamma)  # V(s_t) = sum_{k < T - t} gamma^k
  v = np.asarray(critics.value(s))
  q = np.asarray(critics.q(s, jnp.zeros((length, 1))))
  # one action: V = Q = the discounted steps-to-go (6.513 at t = 0 ... 1 at t = 9)
  assert np.max(np.abs(q - true)) < 0.25, (q, true)
  assert np.max(np.abs(v - true)) < 0.25, (v, true)
  assert hist[-1]["q_loss"] < hist[0]["q_loss"]
