"""Uni-O4 ensemble behaviour cloning (`papers/unio4/bc.py`): the loss against hand-computed values, and what
the official disagreement term really does (it only rescales the BC gradient; diversity comes from initialisation)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.papers import unio4
from iclr24_jax.papers.unio4 import stages
from .helpers import _const_policy_params, _random_ensemble


POLICY_1D = unio4.GaussianPolicy(action_dim=1, hidden=(2,))


def test_ensemble_bc_loss_hand_values():
  # Three constant policies: pi1 = N(0.5, e^-1), pi2 = N(0, e^-1), pi3 = N(-0.5, e^-2); data actions a = 0.5, 0.
  # log N(a; m, s) = -((a - m) / s)^2 / 2 - log s - log(2 pi) / 2, log(2 pi) / 2 = 0.918938533:
  #   pi1: a=.5 -> 0 + 1 - 0.918938533 = 0.081061467; a=0 -> -(0.5 e)^2/2 + 1 - 0.9189 = -0.842570545
  #   pi2: a=.5 -> -0.842570545; a=0 -> 0.081061467
  #   pi3: a=.5 -> -(1 e^2)^2/2 + 2 - 0.9189 = -26.218013550; a=0 -> -(0.5 e^2)^2/2 + 2 - 0.9189 = -5.743707287
  # max over the others: i=1 -> (-0.842570545, 0.081061467); i=2 -> (0.081061467, -0.842570545);
  #                      i=3 -> (0.081061467, 0.081061467)
  # L_i = mean_b[-(1 + a) logp_i + a max_other], a = 0.1:
  #   L_1 = mean(-1.1 * 0.081061467 + 0.1 * -0.842570545, -1.1 * -0.842570545 + 0.1 * 0.081061467)
  #       = mean(-0.173424669, 0.934933746) = 0.380754539 = L_2
  #   L_3 = mean(1.1 * 26.218013550 + 0.0081061467, 1.1 * 5.743707287 + 0.0081061467)
  #       = mean(28.847921052, 6.326184163) = 17.587052607;  sum = 18.348561686
  params = _const_policy_params([0.5, 0.0, -0.5], [-1.0, -1.0, -2.0])
  batch = {"obs": jnp.zeros((2, 1)), "actions": jnp.asarray([[0.5], [0.0]])}
  total, m = unio4.ensemble_bc_loss(params, batch, 0.1)
  np.testing.assert_allclose(float(total), 18.348561686, atol=1e-4)
  np.testing.assert_allclose(np.asarray(m["bc_loss"]), [0.380754539, 0.380754539, 17.587052607], atol=1e-4)
  np.testing.assert_allclose(np.asarray(m["nll"]), [0.380754539, 0.380754539, 15.980860419], atol=1e-4)
  stacked = unio4.stack_trees(params)
  total_s, _ = unio4.ensemble_bc_loss(stacked, batch, 0.1, policy=POLICY_1D)
  np.testing.assert_allclose(float(total_s), float(total), rtol=1e-6)
  # alpha = 0: plain NLL per member: 0.380754539 * 2 + (26.21801355 + 5.743707287) / 2 = 16.742475917
  total0, _ = unio4.ensemble_bc_loss(stacked, batch, 0.0)
  np.testing.assert_allclose(float(total0), 16.742475917, atol=1e-4)


def _toy_bc_batch(n=64, obs_dim=3, action_dim=2, seed=0):
  rng = np.random.default_rng(seed)
  obs = rng.normal(size=(n, obs_dim)).astype(np.float32)
  w = rng.normal(size=(obs_dim, action_dim)).astype(np.float32)
  act = np.tanh(obs @ w + 0.1 * rng.normal(size=(n, action_dim))).astype(np.float32)
  return {"obs": jnp.asarray(obs), "actions": jnp.asarray(act)}


def test_official_disagreement_term_only_rescales_the_bc_gradient():
  # With the max over the other policies stop-gradient, grad L_i = -(1 + alpha) grad log pi_i(a|s).
  policy, params = _random_ensemble(jax.random.key(0))
  batch = _toy_bc_batch()
  grads = jax.jit(lambda p: (jax.grad(lambda q: unio4.ensemble_bc_loss(q, batch, 0.1, policy=policy)[0])(p),
                             jax.grad(lambda q: unio4.ensemble_bc_loss(q, batch, 0.0, policy=policy)[0])(p)))
  g_alpha, g_bc = grads(params)
  # (gradients are batch sums of terms up to ~1e2, so the absolute tolerance is float32 eps x 1e2 x a few)
  chex.assert_trees_all_close(g_alpha, jax.tree.map(lambda g: 1.1 * g, g_bc), rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def bc_runs():
  """150 Adam steps of a 4-member ensemble on one batch: random or identical initial members, alpha 0.1 or 0."""
  batch = _toy_bc_batch(seed=1)
  tx = optax.adam(3e-3)
  policy, params = _random_ensemble(jax.random.key(1), k=4)
  _, same = _random_ensemble(jax.random.key(1), k=4, identical=True)
  out = {}
  for alpha in (0.0, 0.1):
    go = jax.jit(lambda state, alpha=alpha: jax.lax.scan(
        lambda st, _: unio4.bc_step(st, batch, policy=policy, alpha=alpha), state, None, length=150))
    for identical, p in ((False, params), (True, same)):  # one compile per alpha
      state, m = go(stages.ensemble_state(p, tx))
      out[(identical, alpha)] = (state.params, float(unio4.pairwise_disagreement(state.params, policy, batch["obs"])),
                                 m)
  return out


def test_ensemble_diversity_comes_from_initialisation(bc_runs):
  # The official disagreement term (max over the others, stop-gradient, at the data action) rescales each
  # member's BC gradient by (1 + alpha); Adam removes that scale, so the ensemble trains as with alpha = 0:
  p_alpha, d_alpha, m = bc_runs[(False, 0.1)]
  p_zero, d_zero, _ = bc_runs[(False, 0.0)]
  chex.assert_trees_all_close(p_alpha, p_zero, rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(d_alpha, d_zero, rtol=1e-3)
  # the members do differ (different initialisations) ...
  assert d_alpha > 0.01
  assert float(m["loss"][-1]) < float(m["loss"][0])
  # ... and identical members stay identical under the term: it is no diversity force by itself.
  assert bc_runs[(True, 0.1)][1] == 0.0 and bc_runs[(True, 0.0)][1] == 0.0
