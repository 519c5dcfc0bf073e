"""GAE, the PPO clipped objective and the value loss (`rl/losses.py`) against hand-computed values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.rl import distributions, losses


# ---------------------------------------------------------------------------------------------------------------
# GAE. T = 3, gamma = 0.9, lambda = 0.8 (gamma * lambda = 0.72); rewards (1, 2, 3), V(s) = (0.5, 1.0, 1.5),
# V(s') = (1.0, 1.5, 2.0):
#   delta = (1 + 0.9 * 1.0 - 0.5, 2 + 0.9 * 1.5 - 1.0, 3 + 0.9 * 2.0 - 1.5) = (1.4, 2.35, 3.3)
#   no ends:         A2 = 3.3, A1 = 2.35 + 0.72 * 3.3 = 4.726, A0 = 1.4 + 0.72 * 4.726 = 4.80272
#   terminal at t=1: delta1 = 2 - 1.0 = 1.0, A1 = 1.0 (chain cut), A0 = 1.4 + 0.72 * 1.0 = 2.12, A2 = 3.3
#   time limit at 1: delta1 = 2.35 (bootstraps from V(s'_1)), A1 = 2.35, A0 = 1.4 + 0.72 * 2.35 = 3.092
# ---------------------------------------------------------------------------------------------------------------


R = jnp.array([1.0, 2.0, 3.0])
V = jnp.array([0.5, 1.0, 1.5])
NV = jnp.array([1.0, 1.5, 2.0])
F = jnp.zeros(3, bool)


@pytest.mark.parametrize("term,done,expected", [
    ([0, 0, 0], [0, 0, 0], [4.80272, 4.726, 3.3]),
    ([0, 1, 0], [0, 1, 0], [2.12, 1.0, 3.3]),
    ([0, 0, 0], [0, 1, 0], [3.092, 2.35, 3.3]),
])
def test_gae_hand_computed(term, done, expected):
  adv, ret = jax.jit(losses.gae, static_argnums=(5, 6))(R, V, NV, jnp.array(term, bool), jnp.array(done, bool),
                                                         0.9, 0.8)
  np.testing.assert_allclose(adv, expected, rtol=1e-6)
  np.testing.assert_allclose(ret, np.asarray(expected) + np.asarray(V), rtol=1e-6)


def test_gae_batched_matches_columns():
  rng = np.random.default_rng(0)
  r, v, nv = (jnp.asarray(rng.normal(size=(7, 4)), jnp.float32) for _ in range(3))
  d = jnp.asarray(rng.random((7, 4)) < 0.3)
  adv, _ = losses.gae(r, v, nv, d, d, 0.99, 0.95)
  for b in range(4):
    a_b, _ = losses.gae(r[:, b], v[:, b], nv[:, b], d[:, b], d[:, b], 0.99, 0.95)
    np.testing.assert_allclose(adv[:, b], a_b, rtol=1e-6)


def test_gae_from_dones_is_purejaxrl_gae():
  # With no dones, V(s'_t) = V(s_{t+1}) and the last bootstrap value: identical to gae with next_values.
  adv1, _ = losses.gae_from_dones(R, V, F, jnp.asarray(2.0), 0.9, 0.8)
  adv2, _ = losses.gae(R, V, jnp.array([1.0, 1.5, 2.0]), F, F, 0.9, 0.8)
  np.testing.assert_allclose(adv1, adv2, rtol=1e-6)


def test_gae_shape_error():
  with pytest.raises(ValueError, match="shapes differ"):
    losses.gae(R, V[:2], NV, F, F, 0.9, 0.8)


# ---------------------------------------------------------------------------------------------------------------
# PPO clipped objective, eps = 0.2. ratios (1.5, 0.5, 1.1), advantages (1, -1, 2):
#   min(rA, clip(r)A) = (min(1.5, 1.2), min(-0.5, -0.8), min(2.2, 2.2)) = (1.2, -0.8, 2.2)
#   loss = -(1.2 - 0.8 + 2.2) / 3 = -0.8666667
#   weights (1, 2, 0): -(1.2 - 1.6 + 0) / 3 = +0.1333333
#   clip fraction: |r - 1| > 0.2 for 2 of 3 -> 0.6666667
#   approx_kl = mean((r - 1) - log r) = (0.0945349 + 0.1931472 + 0.0046898) / 3 = 0.0974573
# ---------------------------------------------------------------------------------------------------------------


RATIOS = np.array([1.5, 0.5, 1.1])
ADV = jnp.array([1.0, -1.0, 2.0])
OLD = jnp.array([-1.0, -2.0, -0.5])
NEW = OLD + jnp.log(jnp.asarray(RATIOS, jnp.float32))


def test_ppo_clip_objective_hand_computed():
  loss, st = jax.jit(losses.ppo_clip_objective)(NEW, OLD, ADV)
  np.testing.assert_allclose(loss, -2.6 / 3, atol=1e-4)
  np.testing.assert_allclose(st.clip_fraction, 2 / 3, rtol=1e-5)
  np.testing.assert_allclose(st.approx_kl, 0.0974573, atol=1e-6)
  wloss, _ = losses.ppo_clip_objective(NEW, OLD, ADV, weights=jnp.array([1.0, 2.0, 0.0]))
  np.testing.assert_allclose(wloss, 0.4 / 3, atol=1e-4)


def test_ppo_clip_gradient_is_zero_where_clipped():
  # d loss / d log_prob_i = -w_i r_i A_i / N where the unclipped term is the min, else 0: samples 0 and 1 are
  # clipped (their min is the clipped constant), sample 2 is not: grad = (0, 0, -1.1 * 2 / 3).
  g = jax.grad(lambda lp: losses.ppo_clip_objective(lp, OLD, ADV)[0])(NEW)
  np.testing.assert_allclose(g, [0.0, 0.0, -2.2 / 3], atol=1e-6)


def test_ppo_clip_bad_eps():
  with pytest.raises(ValueError, match="clip_eps"):
    losses.ppo_clip_objective(NEW, OLD, ADV, clip_eps=0.0)


def test_value_loss_hand_computed():
  # values (1, 2), returns (1.5, 1.0), old (0.8, 2.5), eps 0.2:
  #  unclipped squared errors (0.25, 1.0) -> 0.5 * mean = 0.3125
  #  clipped values (0.8 + 0.2, 2.5 - 0.2) = (1.0, 2.3) -> errors (0.25, 1.69); max -> (0.25, 1.69) -> 0.485
  v, ret, old = jnp.array([1.0, 2.0]), jnp.array([1.5, 1.0]), jnp.array([0.8, 2.5])
  np.testing.assert_allclose(losses.value_loss(v, ret), 0.3125, atol=1e-6)
  np.testing.assert_allclose(losses.value_loss(v, ret, old, 0.2), 0.485, atol=1e-6)
  with pytest.raises(ValueError, match="old_values"):
    losses.value_loss(v, ret, None, 0.2)


def test_ppo_loss_combines_terms():
  logits = jnp.array([[0.1, 0.5], [1.0, -1.0], [0.0, 0.3]])
  dist = distributions.Categorical(logits)
  act = jnp.array([0, 1, 1])
  batch = {"action": act, "log_prob": dist.log_prob(act) - jnp.log(jnp.asarray(RATIOS, jnp.float32)),
           "advantage": ADV, "return": jnp.array([1.0, 0.0, 2.0]), "value": jnp.zeros(3)}
  values = jnp.array([0.5, 0.5, 0.5])
  total, m = losses.ppo_loss(dist, values, batch, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01, normalize_adv=False)
  # the policy term sees ratios (1.5, 0.5, 1.1) again -> -2.6 / 3; value: 0.5 * mean((.5, .5, 1.5)^2) = 0.458333
  np.testing.assert_allclose(m["policy_loss"], -2.6 / 3, atol=1e-4)
  np.testing.assert_allclose(m["value_loss"], 0.5 * (0.25 + 0.25 + 2.25) / 3, atol=1e-6)
  np.testing.assert_allclose(total, m["policy_loss"] + 0.5 * m["value_loss"] - 0.01 * m["entropy"], atol=1e-6)
