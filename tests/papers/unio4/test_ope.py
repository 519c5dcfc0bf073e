"""Uni-O4 offline policy evaluation (`papers/unio4/ope.py`) on a hand-made model: the score, the per-state sums and
the paired difference by hand."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import unio4


class _LineModel:
  """s' = s + a; terminal once |s'[0]| > 1."""

  def step(self, key, obs, action):
    nxt = obs + action
    return nxt, jnp.zeros(obs.shape[0]), jnp.abs(nxt[:, 0]) > 1.0


def test_offline_policy_evaluation_hand_values():
  # policy a = 0.5, q(s, a) = s. Row 0 from s=0: q = 0, 0.5, 1.0 (s'=1.5 terminal after the last step);
  # row 1 from s=0.6: q = 0.6, then s' = 1.1 is terminal. score = (0 + .5 + 1 + .6) / 4 = 0.525
  score = unio4.offline_policy_evaluation(jax.random.key(0), _LineModel(), lambda s: jnp.full_like(s, 0.5),
                                          lambda s, a: s[:, 0], jnp.asarray([[0.0], [0.6]]), 3)
  np.testing.assert_allclose(float(score), 0.525, rtol=1e-6)
  with pytest.raises(ValueError, match="horizon"):
    unio4.offline_policy_evaluation(jax.random.key(0), _LineModel(), lambda s: s, lambda s, a: s[:, 0],
                                    jnp.zeros((2, 1)), 0)


def test_ope_per_state_hand_values_and_paired_difference():
  # Same rollouts as above: row 0 sums q = 0 + .5 + 1 = 1.5 over 3 alive states, row 1 sums 0.6 over 1.
  q_sum, count = unio4.ope_per_state(jax.random.key(0), _LineModel(), lambda s: jnp.full_like(s, 0.5),
                                     lambda s, a: s[:, 0], jnp.asarray([[0.0], [0.6]]), 3)
  np.testing.assert_allclose(np.asarray(q_sum), [1.5, 0.6], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(count), [3.0, 1.0])
  # Per-state scores 0.5 and 0.6 vs a behaviour policy scoring 0.2 and 0.5: d = (0.3, 0.1), mean 0.2,
  # SE = std([0.3, 0.1], ddof=1) / sqrt(2) = 0.141421 / 1.414214 = 0.1.
  mean, se = unio4.paired_ope_difference(q_sum, count, jnp.asarray([0.6, 0.5]), jnp.asarray([3.0, 1.0]))
  np.testing.assert_allclose(float(mean), 0.2, rtol=1e-5)
  np.testing.assert_allclose(float(se), 0.1, rtol=1e-5)
  with pytest.raises(ValueError, match=">= 2 start states"):
    unio4.paired_ope_difference(q_sum[:1], count[:1], q_sum[:1], count[:1])
