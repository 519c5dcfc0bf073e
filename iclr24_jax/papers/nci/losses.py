"""Losses of NCI and of the two baselines (ERM, DANN), all with one signature.

Shapes: source_x [K, B, H, W, C] (K source domains, B examples each), source_y [K, B] int,
target_x [B_t, H, W, C] (unlabelled target). Domain labels: 0 = target, k = source domain k (1..K).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from iclr24_jax.common import checks
from iclr24_jax.papers.nci.model import Networks

TARGET_DOMAIN = 0


def _ce(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example cross-entropy, logits [..., C], integer labels [...] -> [...]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def source_domain_labels(num_domains: int, batch: int) -> jax.Array:
  """[K, B] int32 with row k equal to k + 1 (sources are 1..K; 0 is the target)."""
  return jnp.broadcast_to(jnp.arange(1, num_domains + 1, dtype=jnp.int32)[:, None], (num_domains, batch))


def discriminator_loss(disc_params: Any, nets: Networks, source_features: jax.Array, target_features: jax.Array
                       ) -> tuple[jax.Array, dict]:
  """The discriminator's loss on frozen features.

  L_D = sum_k CE(D(sg f(x_s^k)), k) + CE(D(sg f(x_t)), 0), each CE a mean over the domain's batch
  (the official code sums the per-domain means).

  Args:
    disc_params: discriminator params.
    nets: the networks.
    source_features: [K, B, F] (gradients are stopped here).
    target_features: [B_t, F] (gradients are stopped here).

  Returns:
    (loss, {'d_loss', 'd_acc'}).
  """
  checks.shapes("nci.discriminator_loss", source_features=(source_features, "K B F"),
                target_features=(target_features, "T F"))
  fs = jax.lax.stop_gradient(source_features)
  ft = jax.lax.stop_gradient(target_features)
  k, b = fs.shape[:2]
  logits_s = nets.domain_logits(disc_params, fs)                          # [K, B, K+1]
  labels_s = source_domain_labels(k, b)
  logits_t = nets.domain_logits(disc_params, ft)                          # [B_t, K+1]
  labels_t = jnp.full(ft.shape[:1], TARGET_DOMAIN, jnp.int32)
  # official: abhrac/nci@d475ba1 algorithms.py:120-133 (loss_d)
  loss = jnp.sum(jnp.mean(_ce(logits_s, labels_s), axis=1)) + jnp.mean(_ce(logits_t, labels_t))
  acc = (jnp.sum(jnp.argmax(logits_s, -1) == labels_s) + jnp.sum(jnp.argmax(logits_t, -1) == labels_t)) / (
      k * b + ft.shape[0])
  return loss, {"d_loss": loss, "d_acc": acc}


def _nll(nets: Networks, model_params: Any, source_x: jax.Array, source_y: jax.Array, adv_weight: Any = 0.0,
         where: str = "nci.loss_fn"):
  # Shapes and label dtype at trace time; class ids outside [0, C) and a traced adv_weight < 0 poison the NLL.
  checks.shapes(where, source_x=(source_x, "K B ..."), source_y=(source_y, "K B"))
  checks.dtype(where, "source_y", source_y, "integer", "class ids.")
  feats, logits = nets.features_and_logits(model_params, source_x)        # [K, B, F], [K, B, C]
  ok = checks.all_ok(checks.indices(where, "source_y", source_y, logits.shape[-1], "class ids of the classifier."),
                     checks.in_range(where, "adv_weight", adv_weight, 0.0, None, hint="lambda (official 1/K)."))
  # official: abhrac/nci@d475ba1 algorithms.py:124, 142 (nll)
  nll = checks.poison(jnp.mean(jnp.mean(_ce(logits, source_y), axis=1)), ok)   # mean_k of per-domain means
  acc = jnp.mean(jnp.argmax(logits, -1) == source_y)
  return feats, nll, acc


def erm_model_loss(model_params: Any, disc_params: Any, nets: Networks, source_x: jax.Array, source_y: jax.Array,
                   target_x: jax.Array, adv_weight: float) -> tuple[jax.Array, dict]:
  """ERM: mean_k CE(h(f(x_s^k)), y). `disc_params`, `target_x`, `adv_weight` are unused (shared signature)."""
  del disc_params, target_x, adv_weight
  _, nll, acc = _nll(nets, model_params, source_x, source_y, where="nci.erm_model_loss")
  return nll, {"loss": nll, "nll": nll, "adv": jnp.zeros(()), "src_acc": acc}


def loss_fn(model_params: Any, disc_params: Any, nets: Networks, source_x: jax.Array, source_y: jax.Array,
            target_x: jax.Array, adv_weight: float) -> tuple[jax.Array, dict]:
  """NCI's featurizer + classifier loss: mean_k CE(h(f(x_s^k)), y) + lambda CE(D(f(x_sources)), 0).

  Source features are pushed towards the *target* label of the (fixed) discriminator; the target is
  never fed through the featurizer here, so target features get exactly zero adversarial gradient:
  the non-commutative direction. `target_x` is accepted only to share the signature of the others.

  Args:
    model_params: featurizer + classifier params (differentiated).
    disc_params: discriminator params (held fixed: the caller differentiates model_params only).
    nets: the networks.
    source_x: [K, B, H, W, C]; source_y: [K, B].
    target_x: [B_t, H, W, C] (unused).
    adv_weight: lambda. The official code divides the adversarial CE by the number of source domains,
      i.e. lambda = 1/K; the configs default to that.

  Returns:
    (loss, metrics).
  """
  del target_x
  feats, nll, acc = _nll(nets, model_params, source_x, source_y, adv_weight)
  logits_d = nets.domain_logits(disc_params, feats)                       # [K, B, K+1]
  # official: abhrac/nci@d475ba1 algorithms.py:139-141 (loss_adv)
  adv = jnp.mean(_ce(logits_d, jnp.full(feats.shape[:2], TARGET_DOMAIN, jnp.int32)))
  # official: abhrac/nci@d475ba1 algorithms.py:145
  loss = nll + adv_weight * adv
  return loss, {"loss": loss, "nll": nll, "adv": adv, "src_acc": acc}



def dann_model_loss(model_params: Any, disc_params: Any, nets: Networks, source_x: jax.Array, source_y: jax.Array,
                    target_x: jax.Array, adv_weight: float) -> tuple[jax.Array, dict]:
  """DANN (commutative alignment): mean_k CE(h(f(x_s^k)), y) - lambda L_D(f(x_s), f(x_t)) / (K + 1).

  The featurizer maximises the discriminator's loss on source *and* target features (gradient
  reversal, Ganin et al. 2016; DomainBed's `gen_loss = classifier_loss - lambda disc_loss`), so both
  sides move towards each other.

  Returns:
    (loss, metrics).
  """
  feats, nll, acc = _nll(nets, model_params, source_x, source_y, adv_weight, "nci.dann_model_loss")
  feats_t, _ = nets.features_and_logits(model_params, target_x)
  k, b = feats.shape[:2]
  logits_s = nets.domain_logits(disc_params, feats)
  logits_t = nets.domain_logits(disc_params, feats_t)
  # Deviation: mean over the K + 1 domains' mean CE (DomainBed's DANN averages its discriminator CE over
  # examples; a plain sum would scale lambda by K + 1).
  d_loss = (jnp.sum(jnp.mean(_ce(logits_s, source_domain_labels(k, b)), axis=1))
            + jnp.mean(_ce(logits_t, jnp.full(feats_t.shape[:1], TARGET_DOMAIN, jnp.int32)))) / (k + 1)
  loss = nll - adv_weight * d_loss
  return loss, {"loss": loss, "nll": nll, "adv": d_loss, "src_acc": acc}
