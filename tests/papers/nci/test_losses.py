"""NCI losses (`papers/nci/losses.py`): hand-computed values, gradients against independent references, the
direction of the adversarial updates."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers import nci
from .helpers import B, K


def _biased_disc(state, bias):
  disc = jax.tree.map(jnp.zeros_like, state.params["disc"])
  disc["Dense_0"]["bias"] = jnp.asarray(bias, jnp.float32)
  return disc


def test_discriminator_loss_labels_and_value(setup):
  nets, state, src, tgt = setup
  # Zero weights and bias b = [0, 1, 2]: CE(label c) = lse(b) - b_c, lse = log(1 + e + e^2) = 2.40760596.
  # Sources are domains 1 and 2, the target is 0:
  # loss = (2.40760596 - 1) + (2.40760596 - 2) + (2.40760596 - 0) = 4.22281788.
  disc = _biased_disc(state, [0.0, 1.0, 2.0])
  fs = jnp.ones((K, B, 8))
  ft = jnp.ones((B, 8))
  loss, m = nci.discriminator_loss(disc, nets, fs, ft)
  np.testing.assert_allclose(float(loss), 4.22281788, atol=1e-4)
  # argmax is always domain 2, so only source domain 2's B examples are right: 4 / 12.
  np.testing.assert_allclose(float(m["d_acc"]), 4 / 12, rtol=1e-6)


def test_model_loss_adds_lambda_times_target_ce(setup):
  nets, state, src, tgt = setup
  disc = _biased_disc(state, [0.0, 1.0, 2.0])
  erm, _ = nci.erm_model_loss(state.params["model"], disc, nets, src["x"], src["y"], tgt, 0.5)
  nci_loss, m = nci.loss_fn(state.params["model"], disc, nets, src["x"], src["y"], tgt, 0.5)
  # adversarial CE towards label 0 with logits b: lse(b) - 0 = 2.40760596; lambda = 0.5.
  np.testing.assert_allclose(float(m["adv"]), 2.40760596, atol=1e-4)
  np.testing.assert_allclose(float(nci_loss - erm), 0.5 * 2.40760596, atol=1e-4)


def _random_disc(state):
  """A discriminator with random N(0, 1) weights (the initial one is zero: uniform outputs, no gradient)."""
  leaves, tree = jax.tree.flatten(state.params["disc"])
  keys = jax.random.split(jax.random.key(7), len(leaves))
  return jax.tree.unflatten(tree, [jax.random.normal(k, l.shape, l.dtype) for k, l in zip(keys, leaves)])


def _ref_ce(logits, label):
  """Cross-entropy written out: logsumexp(logits) - logits[label], averaged over the leading axes."""
  return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., label])


def _ref_losses(nets, params, disc, src, tgt, lam):
  """Independent references: NCI pushes only source features to the target label 0; DANN reverses the
  discriminator's loss on sources (labels 1..K) and target (label 0), averaged over the K + 1 domains."""
  fs, logits = nets.features_and_logits(params, src["x"])
  nll = jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, src["y"][..., None], -1)[..., 0])
  nci_ref = nll + lam * _ref_ce(nets.domain_logits(disc, fs), 0)
  ft, _ = nets.features_and_logits(params, tgt)
  d = sum(_ref_ce(nets.domain_logits(disc, fs[k]), k + 1) for k in range(K)) + _ref_ce(nets.domain_logits(disc, ft), 0)
  dann_ref = nll - lam * d / (K + 1)
  return nci_ref, dann_ref, d / (K + 1)


def test_model_gradients_match_independent_references(setup):
  nets, state, src, tgt = setup
  params, disc = state.params["model"], _random_disc(state)
  for fn, which in ((nci.loss_fn, 0), (nci.dann_model_loss, 1)):
    got = jax.grad(lambda p: fn(p, disc, nets, src["x"], src["y"], tgt, 0.7)[0])(params)
    want = jax.grad(lambda p: _ref_losses(nets, p, disc, src, tgt, 0.7)[which])(params)
    chex.assert_trees_all_close(got, want, rtol=1e-4, atol=1e-6)
  # DANN moves the target's features too (commutative), NCI leaves them alone (its loss never sees them)
  g_dann = jax.grad(lambda t: nci.dann_model_loss(params, disc, nets, src["x"], src["y"], t, 1.0)[0])(tgt)
  assert float(jnp.max(jnp.abs(g_dann))) > 0.0


def test_adversarial_updates_move_features_the_right_way(setup):
  # One small SGD step on the model loss with a large lambda (the adversarial term dominates), discriminator
  # fixed: NCI must bring the source features closer to the target label (its adversarial CE falls), DANN
  # must confuse the discriminator (its averaged domain CE rises). A flipped sign in either fails here.
  nets, state, src, tgt = setup
  params, disc, lam, lr = state.params["model"], _random_disc(state), 1e3, 1e-5

  def sgd(fn):
    g = jax.grad(lambda p: fn(p, disc, nets, src["x"], src["y"], tgt, lam)[0])(params)
    return jax.tree.map(lambda p, d: p - lr * d, params, g)

  def adv_terms(p):
    nci_ref, _, d = _ref_losses(nets, p, disc, src, tgt, 1.0)
    fs, _ = nets.features_and_logits(p, src["x"])
    return float(_ref_ce(nets.domain_logits(disc, fs), 0)), float(d)

  nci_before, d_before = adv_terms(params)
  assert adv_terms(sgd(nci.loss_fn))[0] < nci_before
  assert adv_terms(sgd(nci.dann_model_loss))[1] > d_before
