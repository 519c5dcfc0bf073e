"""Image classifiers in Flax Linen: MLP, CNN, ResNet (18-style basic blocks or ResNet-50 bottlenecks), the
FedAvg CIFAR CNN and Inception-v3.

Every model maps images [B, H, W, C] (or features [B, D] for the MLP) to logits [B, num_classes];
with `return_features=True` it also returns the penultimate representation [B, F] (used for kNN
graphs in d2pruning, featurizers in nci, embeddings in clip_ood). The paper-size networks (ResNet-50 for nci's
DomainBed setting, the official Co-Boosting client CNN, Inception-v3 for safeguards' CUB embeddings) are built here
so `experiments.scale` can compile the papers at their own sizes.
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


class Affine(nn.Module):
  """A per-channel scale and bias on the last axis: what a BatchNorm frozen in eval mode computes once its running
  statistics are folded in (DomainBed's ResNet and torchvision's eval-mode Inception-v3 keep BatchNorm frozen)."""

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
    bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],))
    return x * scale + bias


def _norm(kind: str, train: bool, name: str | None = None):
  if kind == "affine":
    return Affine(name=name)
  if kind == "batch":
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)
  if kind == "group":
    return nn.GroupNorm(num_groups=None, group_size=8, name=name)
  if kind == "layer":
    return nn.LayerNorm(name=name)
  if kind == "none":
    return lambda x: x
  raise ValueError(f"unknown norm '{kind}'; choose 'batch', 'group', 'layer', 'affine' or 'none'.")


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


class Bottleneck(nn.Module):
  """ResNet-50's bottleneck block (He et al. 2016, torchvision's v1.5: the stride on the 3x3 conv):
  1x1 -> 3x3 (stride) -> 1x1 to 4 x features, each normalised, ReLU after the first two and after the sum; a
  strided 1x1 projection on the shortcut when the shape changes."""

  features: int
  strides: int = 1
  norm: str = "group"

  @nn.compact
  def __call__(self, x, train: bool = False):
    y = nn.relu(_norm(self.norm, train)(nn.Conv(self.features, (1, 1), use_bias=False)(x)))
    y = nn.Conv(self.features, (3, 3), (self.strides, self.strides), padding=((1, 1), (1, 1)), use_bias=False)(y)
    y = nn.relu(_norm(self.norm, train)(y))
    y = _norm(self.norm, train)(nn.Conv(4 * self.features, (1, 1), use_bias=False)(y))
    r = x
    if r.shape != y.shape:
      r = nn.Conv(4 * self.features, (1, 1), (self.strides, self.strides), use_bias=False)(r)
      r = _norm(self.norm, train)(r)
    return nn.relu(r + y)


class ResNet(nn.Module):
  """ResNet: the ResNet-18-style network for small images (3x3 stem, no max-pool) by default, or ImageNet's
  ResNet-50 with `block='bottleneck'`, `stem='imagenet'`, stage_sizes (3, 4, 6, 3) (`create_model('resnet50')`).

  Attributes:
    num_classes: number of classes.
    stage_sizes: blocks per stage ([2, 2, 2, 2] is ResNet-18).
    width: channels of the first stage (doubling per stage; a bottleneck stage outputs 4 x its width).
    norm: 'group' (default: batch-independent, so sharded and unsharded runs agree exactly),
      'batch' (running statistics in `extra['batch_stats']`), 'layer', 'affine' (frozen BatchNorm) or 'none'.
    block: 'basic' (two 3x3 convs) or 'bottleneck' (1x1 -> 3x3 -> 1x1 x4).
    stem: 'small' (one 3x3 conv at full resolution) or 'imagenet' (7x7 stride-2 conv, norm, ReLU, 3x3 stride-2
      max-pool: a 224 x 224 input reaches the first stage at 56 x 56).
  """

  num_classes: int = 10
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  width: int = 64
  norm: str = "group"
  block: str = "basic"
  stem: str = "small"

  @nn.compact
  def __call__(self, x, train: bool = False, return_features: bool = False):
    if self.block not in ("basic", "bottleneck") or self.stem not in ("small", "imagenet"):
      raise ValueError(f"ResNet(block={self.block!r}, stem={self.stem!r}): choose block 'basic' or 'bottleneck' "
                       "and stem 'small' or 'imagenet'.")
    if self.stem == "small":
      h = nn.Conv(self.width, (3, 3), padding="SAME", use_bias=False)(x)
      h = nn.relu(_norm(self.norm, train)(h))
    else:
      h = nn.Conv(self.width, (7, 7), (2, 2), padding=((3, 3), (3, 3)), use_bias=False)(x)
      h = nn.relu(_norm(self.norm, train)(h))
      h = nn.max_pool(h, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    block = BasicBlock if self.block == "basic" else Bottleneck
    for i, n_blocks in enumerate(self.stage_sizes):
      for j in range(n_blocks):
        strides = 2 if (i > 0 and j == 0 and h.shape[1] > 1) else 1
        h = block(self.width * 2 ** i, strides, self.norm)(h, train)
    h = jnp.mean(h, axis=(1, 2))
    logits = nn.Dense(self.num_classes)(h)
    return (logits, h) if return_features else logits


class CNNCifar(nn.Module):
  """The CIFAR client CNN of FedAvg-style one-shot FL code (Co-Boosting's official `CNNCifar`): three unpadded 3x3
  convs of `width` channels with ReLU, 2x2 max-pooling after the first two, then one linear layer.

  A 32 x 32 input gives 30 -> 15 -> 13 -> 6 -> 4, so the features are 4 x 4 x width (2,048 for width 128).

  Attributes:
    num_classes: number of classes.
    width: channels of every conv (official 128).
  """

  num_classes: int = 10
  width: int = 128

  @nn.compact
  def __call__(self, x, train: bool = False, return_features: bool = False):
    del train
    h = nn.max_pool(nn.relu(nn.Conv(self.width, (3, 3), padding="VALID")(x)), (2, 2), strides=(2, 2))
    h = nn.max_pool(nn.relu(nn.Conv(self.width, (3, 3), padding="VALID")(h)), (2, 2), strides=(2, 2))
    h = nn.relu(nn.Conv(self.width, (3, 3), padding="VALID")(h))
    h = h.reshape(h.shape[0], -1)
    logits = nn.Dense(self.num_classes)(h)
    return (logits, h) if return_features else logits


class _ConvNorm(nn.Module):
  """Inception's BasicConv2d: conv (no bias) -> norm -> ReLU."""

  features: int
  kernel: tuple[int, int]
  strides: int = 1
  padding: Any = "VALID"
  norm: str = "affine"

  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.Conv(self.features, self.kernel, (self.strides, self.strides), padding=self.padding, use_bias=False)(x)
    return nn.relu(_norm(self.norm, train)(h))


def _pad(kh: int, kw: int):
  return ((kh // 2, kh // 2), (kw // 2, kw // 2))


class InceptionV3(nn.Module):
  """Inception-v3 (Szegedy et al. 2016) as torchvision builds it, without the auxiliary classifier (eval mode).

  299 x 299 inputs: stem 299 -> 149 -> 147 -> 73 -> 71 -> 35, three Inception-A blocks (35 x 35: 256, 288,
  288 channels), a grid reduction to 17 x 17 (768), four Inception-C blocks with 7 x 1 / 1 x 7 factorised convs
  (inner widths 128, 160, 160, 192), a reduction to 8 x 8 (1,280), two Inception-E blocks (2,048), global
  average pooling (the 2,048-d features safeguards' concept detectors read) and a linear classifier.

  Attributes:
    num_classes: outputs of the final linear layer.
    norm: the norm after every conv: 'affine' (default; BatchNorm frozen as in eval mode) or any `_norm` kind.
  """

  num_classes: int = 1000
  norm: str = "affine"

  @nn.compact
  def __call__(self, x, train: bool = False, return_features: bool = False):
    def cn(h, f, k, s=1, p="VALID"):
      return _ConvNorm(f, k, s, p, self.norm)(h, train)

    def avg3(h):  # 3x3 stride-1 average pooling, padding counted (torch's count_include_pad default)
      return nn.avg_pool(h, (3, 3), (1, 1), padding=((1, 1), (1, 1)), count_include_pad=True)

    def max3(h):
      return nn.max_pool(h, (3, 3), strides=(2, 2))

    h = cn(x, 32, (3, 3), 2)
    h = cn(h, 32, (3, 3))
    h = max3(cn(h, 64, (3, 3), p=_pad(3, 3)))
    h = cn(h, 80, (1, 1))
    h = max3(cn(h, 192, (3, 3)))
    for pool_features in (32, 64, 64):                                        # Mixed_5b-d (Inception-A)
      b5 = cn(cn(h, 48, (1, 1)), 64, (5, 5), p=_pad(5, 5))
      b3 = cn(cn(cn(h, 64, (1, 1)), 96, (3, 3), p=_pad(3, 3)), 96, (3, 3), p=_pad(3, 3))
      h = jnp.concatenate([cn(h, 64, (1, 1)), b5, b3, cn(avg3(h), pool_features, (1, 1))], -1)
    b3 = cn(h, 384, (3, 3), 2)                                                # Mixed_6a (Inception-B)
    bd = cn(cn(cn(h, 64, (1, 1)), 96, (3, 3), p=_pad(3, 3)), 96, (3, 3), 2)
    h = jnp.concatenate([b3, bd, max3(h)], -1)
    for c7 in (128, 160, 160, 192):                                           # Mixed_6b-e (Inception-C)
      b7 = cn(cn(cn(h, c7, (1, 1)), c7, (1, 7), p=_pad(1, 7)), 192, (7, 1), p=_pad(7, 1))
      bd = cn(h, c7, (1, 1))
      for f, k in ((c7, (7, 1)), (c7, (1, 7)), (c7, (7, 1)), (192, (1, 7))):
        bd = cn(bd, f, k, p=_pad(*k))
      h = jnp.concatenate([cn(h, 192, (1, 1)), b7, bd, cn(avg3(h), 192, (1, 1))], -1)
    b3 = cn(cn(h, 192, (1, 1)), 320, (3, 3), 2)                               # Mixed_7a (Inception-D)
    b7 = cn(cn(cn(h, 192, (1, 1)), 192, (1, 7), p=_pad(1, 7)), 192, (7, 1), p=_pad(7, 1))
    h = jnp.concatenate([b3, cn(b7, 192, (3, 3), 2), max3(h)], -1)
    for _ in range(2):                                                        # Mixed_7b-c (Inception-E)
      b3 = cn(h, 384, (1, 1))
      b3 = jnp.concatenate([cn(b3, 384, (1, 3), p=_pad(1, 3)), cn(b3, 384, (3, 1), p=_pad(3, 1))], -1)
      bd = cn(cn(h, 448, (1, 1)), 384, (3, 3), p=_pad(3, 3))
      bd = jnp.concatenate([cn(bd, 384, (1, 3), p=_pad(1, 3)), cn(bd, 384, (3, 1), p=_pad(3, 1))], -1)
      h = jnp.concatenate([cn(h, 320, (1, 1)), b3, bd, cn(avg3(h), 192, (1, 1))], -1)
    feats = jnp.mean(h, axis=(1, 2))
    logits = nn.Dense(self.num_classes)(feats)
    return (logits, feats) if return_features else logits


def create_model(model_config: Any, num_classes: int) -> nn.Module:
  """Builds a classifier from `config.model` (name: 'mlp' | 'cnn' | 'mnist_cnn' | 'resnet18' | 'resnet' |
  'resnet50' | 'cnn_cifar' | 'inception_v3').

  Args:
    model_config: ConfigDict with name and the model's fields ('mlp': hidden, dropout; 'cnn': features,
      dense, dropout; 'mnist_cnn': widths; 'resnet18' / 'resnet': stage_sizes, width, norm, block, stem;
      'resnet50': width, norm (default 'affine'); 'cnn_cifar': width; 'inception_v3': norm).
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
                  width=int(model_config.get("width", 64)), norm=model_config.get("norm", "group"),
                  block=model_config.get("block", "basic"), stem=model_config.get("stem", "small"))
  if name == "resnet50":
    return ResNet(num_classes, stage_sizes=(3, 4, 6, 3), width=int(model_config.get("width", 64)),
                  norm=model_config.get("norm", "affine"), block="bottleneck", stem="imagenet")
  if name == "cnn_cifar":
    return CNNCifar(num_classes, width=int(model_config.get("width", 128)))
  if name == "inception_v3":
    return InceptionV3(num_classes, norm=model_config.get("norm", "affine"))
  raise ValueError(f"unknown model.name '{name}'; choose 'mlp', 'cnn', 'mnist_cnn', 'resnet18', 'resnet50', "
                   "'cnn_cifar' or 'inception_v3'.")
