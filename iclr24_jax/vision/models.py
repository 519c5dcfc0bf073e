"""Small image classifiers in Flax Linen: MLP, CNN and a ResNet-18-style network.

Every model maps images [B, H, W, C] (or features [B, D] for the MLP) to logits [B, num_classes];
with `return_features=True` it also returns the penultimate representation [B, F] (used for kNN
graphs in d2pruning, featurizers in nci, embeddings in clip_ood).
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp


class MLP(nn.Module):
  """Multi-layer perceptron on flattened inputs.

  Attributes:
    num_classes: output size (0 returns the last hidden layer only).
    hidden: widths of the hidden layers.
    dropout: dropout rate on hidden layers (needs a 'dropout' rng when train=True).
  """

  num_classes: int = 10
  hidden: Sequence[int] = (256, 256)
  dropout: float = 0.0
  activation: Any = nn.relu

  @nn.compact
  def __call__(self, x, train: bool = False, return_features: bool = False):
    h = x.reshape(x.shape[0], -1)
    for w in self.hidden:
      h = self.activation(nn.Dense(w)(h))
      if self.dropout:
        h = nn.Dropout(self.dropout, deterministic=not train)(h)
    if not self.num_classes:
      return h
    logits = nn.Dense(self.num_classes)(h)
    return (logits, h) if return_features else logits


class CNN(nn.Module):
  """A small convolutional network: [conv3x3 -> relu -> avgpool2] per stage, then dense layers.

  Attributes:
    num_classes: number of classes.
    features: channels per conv stage (each stage halves the resolution while it is > 1).
    dense: width of the hidden dense layer (the feature layer).
  """

  num_classes: int = 10
  features: Sequence[int] = (32, 64)
  dense: int = 128
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x, train: bool = False, return_features: bool = False):
    h = x
    for f in self.features:
      h = nn.relu(nn.Conv(f, (3, 3), padding="SAME")(h))
      if h.shape[1] > 1 and h.shape[2] > 1:
        h = nn.avg_pool(h, (2, 2), strides=(2, 2))
    h = h.reshape(h.shape[0], -1)
    h = nn.relu(nn.Dense(self.dense)(h))
    if self.dropout:
      h = nn.Dropout(self.dropout, deterministic=not train)(h)
    logits = nn.Dense(self.num_classes)(h)
    return (logits, h) if return_features else logits


class MNISTCNN(nn.Module):
  """DomainBed's small-image featurizer (MNIST_CNN) + a linear classifier.

  conv3x3(w0) -> relu -> GroupNorm(8) -> conv3x3(w1, stride 2) -> relu -> GN -> conv3x3(w1) -> relu -> GN
  -> conv3x3(w1) -> relu -> GN -> global average pool (the features) -> Dense(num_classes).
  DomainBed uses widths (64, 128); GroupNorm keeps feature scales bounded, which adversarial
  domain-alignment methods rely on.
  """

  num_classes: int = 10
  widths: Sequence[int] = (64, 128)
  groups: int = 8

  @nn.compact
  def __call__(self, x, train: bool = False, return_features: bool = False):
    w0, w1 = self.widths
    h = x
    for i, (w, s) in enumerate(((w0, 1), (w1, 2), (w1, 1), (w1, 1))):
      h = nn.Conv(w, (3, 3), strides=(s, s), padding="SAME")(h)
      h = nn.GroupNorm(num_groups=self.groups)(nn.relu(h))
    feats = jnp.mean(h, axis=(1, 2))
    logits = nn.Dense(self.num_classes)(feats)
    return (logits, feats) if return_features else logits


def _norm(kind: str, train: bool, name: str | None = None):
  if kind == "batch":
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)
  if kind == "group":
    return nn.GroupNorm(num_groups=None, group_size=8, name=name)
  if kind == "layer":
    return nn.LayerNorm(name=name)
  if kind == "none":
    return lambda x: x
  raise ValueError(f"unknown norm '{kind}'; choose 'batch', 'group', 'layer' or 'none'.")


class BasicBlock(nn.Module):
  features: int
  strides: int = 1
  norm: str = "group"

  @nn.compact
  def __call__(self, x, train: bool = False):
    r = x
    y = nn.Conv(self.features, (3, 3), (self.strides, self.strides), padding="SAME", use_bias=False)(x)
    y = nn.relu(_norm(self.norm, train)(y))
    y = nn.Conv(self.features, (3, 3), padding="SAME", use_bias=False)(y)
    y = _norm(self.norm, train)(y)
    if r.shape != y.shape:
      r = nn.Conv(self.features, (1, 1), (self.strides, self.strides), use_bias=False)(r)
      r = _norm(self.norm, train)(r)
    return nn.relu(r + y)


class ResNet(nn.Module):
  """ResNet-18-style network for small images (3x3 stem, no max-pool).

  Attributes:
    num_classes: number of classes.
    stage_sizes: blocks per stage ([2, 2, 2, 2] is ResNet-18).
    width: channels of the first stage (doubling per stage).
    norm: 'group' (default: batch-independent, so sharded and unsharded runs agree exactly),
      'batch' (running statistics in `extra['batch_stats']`), 'layer' or 'none'.
  """

  num_classes: int = 10
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  width: int = 64
  norm: str = "group"

  @nn.compact
  def __call__(self, x, train: bool = False, return_features: bool = False):
    h = nn.Conv(self.width, (3, 3), padding="SAME", use_bias=False)(x)
    h = nn.relu(_norm(self.norm, train)(h))
    for i, n_blocks in enumerate(self.stage_sizes):
      for j in range(n_blocks):
        strides = 2 if (i > 0 and j == 0 and h.shape[1] > 1) else 1
        h = BasicBlock(self.width * 2 ** i, strides, self.norm)(h, train)
    h = jnp.mean(h, axis=(1, 2))
    logits = nn.Dense(self.num_classes)(h)
    return (logits, h) if return_features else logits


def create_model(model_config: Any, num_classes: int) -> nn.Module:
  """Builds a classifier from `config.model` (name: 'mlp' | 'cnn' | 'mnist_cnn' | 'resnet18' | 'resnet').

  Args:
    model_config: ConfigDict with name and the model's fields ('mlp': hidden, dropout; 'cnn': features,
      dense, dropout; 'mnist_cnn': widths; 'resnet18' / 'resnet': stage_sizes, width, norm).
    num_classes: K, the output width.

  Returns:
    Linen module x [B, H, W, C] (or [B, ...]) -> logits [B, K] ((logits, features) with return_features).

  Raises:
    ValueError: unknown name.
  """
  name = model_config.get("name", "cnn")
  if name == "mlp":
    return MLP(num_classes, hidden=tuple(model_config.get("hidden", (256, 256))),
               dropout=float(model_config.get("dropout", 0.0)))
  if name == "cnn":
    return CNN(num_classes, features=tuple(model_config.get("features", (32, 64))),
               dense=int(model_config.get("dense", 128)), dropout=float(model_config.get("dropout", 0.0)))
  if name == "mnist_cnn":
    return MNISTCNN(num_classes, widths=tuple(model_config.get("widths", (64, 128))))
  if name in ("resnet18", "resnet"):
    return ResNet(num_classes, stage_sizes=tuple(model_config.get("stage_sizes", (2, 2, 2, 2))),
                  width=int(model_config.get("width", 64)), norm=model_config.get("norm", "group"))
  raise ValueError(f"unknown model.name '{name}'; choose 'mlp', 'cnn', 'mnist_cnn' or 'resnet18'.")
