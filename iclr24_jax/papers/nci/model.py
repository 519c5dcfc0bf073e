"""Networks and state for nci: featurizer + classifier (one CNN), a domain discriminator, two optimizers."""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from iclr24_jax.vision.models import CNN, MLP, MNISTCNN, ResNet


@dataclasses.dataclass(frozen=True)
class Networks:
  """The three networks of every method (ERM, DANN and NCI share them).

  Attributes:
    classifier: a vision model returning (logits [B, C], features [B, F]) with `return_features=True`:
      its feature layer is the featurizer f and its last Dense layer the classifier h.
    discriminator: maps features [B, F] to K + 1 domain logits (index 0 = target, 1..K = sources).
  """

  classifier: nn.Module
  discriminator: nn.Module

  def features_and_logits(self, params: Any, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x [..., H, W, C] -> (features [..., F], logits [..., C]); leading axes are flattened and restored."""
    flat, restore = _flatten_lead(x, 3)
    logits, feats = self.classifier.apply({"params": params}, flat, return_features=True)
    return restore(feats), restore(logits)

  def domain_logits(self, params: Any, features: jax.Array) -> jax.Array:
    """features [..., F] -> domain logits [..., K + 1]."""
    flat, restore = _flatten_lead(features, 1)
    return restore(self.discriminator.apply({"params": params}, flat))


def _flatten_lead(x: jax.Array, trailing: int):
  """Flattens the leading axes of x (all but the last `trailing`) last-axis-first, and the inverse for outputs.

  A batch [K, B, ...] sharded over its example axis B stays sharded when flattened B-major ([B, K] -> B K rows, each
  device's rows contiguous); flattening K-major would interleave the devices' rows, and XLA would gather the whole
  batch onto every device and compute it there (measured: an 8-device step cost as much per device as on one).
  """
  n = x.ndim - trailing
  lead = x.shape[:n]
  perm = tuple(reversed(range(n)))
  flat = jnp.transpose(x, perm + tuple(range(n, x.ndim))).reshape((-1,) + x.shape[n:])

  def restore(out: jax.Array) -> jax.Array:
    return jnp.transpose(out.reshape(lead[::-1] + out.shape[1:]), perm + tuple(range(n, n + out.ndim - 1)))

  return flat, restore


def make_networks(model_config: Any, num_classes: int, num_source_domains: int) -> Networks:
  """Builds the classifier CNN and the discriminator from `config.model`.

  Config fields: name ('mnist_cnn' = DomainBed's MNIST_CNN with GroupNorm, as the official code uses for
  small images; 'cnn'; or 'resnet50' = DomainBed's ResNet-50 featurizer for 224 x 224 data sets, with `norm`
  (default 'affine': its BatchNorm is frozen)), widths (mnist_cnn), features/dense (cnn), discriminator ('linear'
  as in the official NCI code, whose `nonlinear_classifier` is False; or 'mlp'), disc_hidden.
  """
  name = model_config.get("name", "mnist_cnn")
  if name == "resnet50":
    clf = ResNet(num_classes, stage_sizes=(3, 4, 6, 3), width=64, norm=model_config.get("norm", "affine"),
                 block="bottleneck", stem="imagenet")
  elif name == "mnist_cnn":
    # Deviation: the paper fine-tunes an ImageNet ResNet-50; on 16x16 digits we train DomainBed's small-image
    # featurizer from scratch (no pretrained weights offline, and CPU budget).
    clf = MNISTCNN(num_classes, widths=tuple(model_config.widths))
  else:
    clf = CNN(num_classes, features=tuple(model_config.features), dense=int(model_config.dense))
  if model_config.get("discriminator", "linear") == "linear":
    disc = MLP(num_source_domains + 1, hidden=())
  else:
    disc = MLP(num_source_domains + 1, hidden=tuple(model_config.get("disc_hidden", (256, 256))))
  return Networks(clf, disc)


@flax.struct.dataclass
class AdversarialState:
  """State with two optimizers: one for featurizer + classifier, one for the discriminator.

  Attributes:
    step: int32 scalar.
    params: {'model': classifier params, 'disc': discriminator params}.
    opt_state: {'model': ..., 'disc': ...}.
    tx_model, tx_disc: the optax transformations (static).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  tx_model: optax.GradientTransformation = flax.struct.field(pytree_node=False, default=None)
  tx_disc: optax.GradientTransformation = flax.struct.field(pytree_node=False, default=None)


def init(key: jax.Array, nets: Networks, input_shape: tuple[int, ...], tx_model: optax.GradientTransformation,
         tx_disc: optax.GradientTransformation) -> AdversarialState:
  """Initialises both networks and both optimizers.

  Args:
    key: init key.
    nets: the networks.
    input_shape: one image's shape [H, W, C].
    tx_model, tx_disc: optimizers (the official code uses Adam with the same lr for both).
  """
  key_clf, key_disc = jax.random.split(key)
  x = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
  clf_params = nets.classifier.init(key_clf, x)["params"]
  _, feats = nets.classifier.apply({"params": clf_params}, x, return_features=True)
  disc_params = nets.discriminator.init(key_disc, feats)["params"]
  params = {"model": clf_params, "disc": disc_params}
  opt_state = {"model": tx_model.init(clf_params), "disc": tx_disc.init(disc_params)}
  return AdversarialState(jnp.zeros((), jnp.int32), params, opt_state, tx_model, tx_disc)
