"""Co-Boosting losses (`papers/coboosting/losses.py`): the ensemble, the hard-sample, adversarial and KD losses by
hand."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import coboosting
from iclr24_jax.papers.coboosting import losses
from .helpers import K


def test_ensemble_logits_equal_weights_is_the_mean_and_weights_are_normalised():
  cl = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3, K)), jnp.float32)
  out = coboosting.ensemble_logits(cl, jnp.full((5,), 0.2))
  chex.assert_shape(out, (3, K))
  np.testing.assert_allclose(out, cl.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(coboosting.ensemble_logits(cl, jnp.full((5,), 0.7)), cl.mean(0), rtol=1e-5, atol=1e-6)
  # (1 * [1, 2] + 3 * [5, 6]) / (1 + 3) = [4, 5]
  two = jnp.asarray([[[1.0, 2.0]], [[5.0, 6.0]]])
  np.testing.assert_allclose(coboosting.ensemble_logits(two, jnp.asarray([1.0, 3.0])), [[4.0, 5.0]], rtol=1e-6)


def test_ensemble_logits_shape_errors():
  with pytest.raises(ValueError, match=r"\[C, B, K\]"):
    coboosting.ensemble_logits(jnp.zeros((3, K)), jnp.ones(3))
  with pytest.raises(ValueError, match="weights"):
    coboosting.ensemble_logits(jnp.zeros((3, 2, K)), jnp.ones(2))


def test_hard_sample_loss_hand_values():
  logits = jnp.asarray([[2.0, 0.0], [0.0, 0.0]])
  labels = jnp.asarray([0, 0])
  # Row 1: p = e^2 / (e^2 + 1) = 0.88079708, CE = 0.12692801, weight 1 - p = 0.11920292 -> 0.01513019.
  # Row 2: p = 0.5, CE = ln 2 = 0.69314718, weight 0.5 -> 0.34657359.  Mean (h = 1): 0.18085189.
  np.testing.assert_allclose(coboosting.hard_sample_loss(logits, labels, 1.0), 0.18085189, atol=1e-4)
  # h = 2: (0.11920292^2 * 0.12692801 + 0.25 * 0.69314718) / 2 = 0.08754518.
  np.testing.assert_allclose(coboosting.hard_sample_loss(logits, labels, 2.0), 0.08754518, atol=1e-4)
  # h = 0 is the plain CE (DENSE): (0.12692801 + 0.69314718) / 2 = 0.41003760.
  np.testing.assert_allclose(coboosting.hard_sample_loss(logits, labels, 0.0), 0.41003760, atol=1e-4)


def test_hard_sample_weight_is_not_differentiated():
  logits = jnp.asarray([[2.0, 0.0, -1.0], [0.5, 0.2, 0.1]])
  labels = jnp.asarray([0, 2])
  g = jax.grad(coboosting.hard_sample_loss)(logits, labels, 1.0)
  p = jax.nn.softmax(logits)
  w = 1.0 - p[jnp.arange(2), labels]
  expected = w[:, None] * (p - jax.nn.one_hot(labels, 3)) / 2  # d mean(w * CE) with w held constant
  np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)


def test_adversarial_and_kd_losses_hand_values():
  t = jnp.asarray([[np.log(3.0), 0.0]])  # softmax = [0.75, 0.25]
  s = jnp.zeros((1, 2))                  # softmax = [0.5, 0.5]
  # KL(t || s) = 0.75 ln 1.5 + 0.25 ln 0.5 = 0.13081204
  np.testing.assert_allclose(coboosting.adversarial_loss(s, t, 1.0), -0.13081204, atol=1e-4)
  # Doubling the logits at T = 2 gives the same distributions; the T^2 factor makes it 4 x 0.13081204.
  np.testing.assert_allclose(coboosting.kd_loss(s, 2.0 * t, 2.0), 0.52324814, atol=1e-4)
  # DENSE mask: both predict class 0 here, so the masked term is zero.
  s_agree = jnp.asarray([[1.0, 0.0]])
  mask = losses.disagreement_mask(s_agree, t)
  np.testing.assert_allclose(coboosting.adversarial_loss(s_agree, t, 1.0, mask), 0.0, atol=1e-6)
