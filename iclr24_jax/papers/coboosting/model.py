"""Networks of Co-Boosting: the synthetic-data generator and the client set (the ensemble's members).

The generator follows the official code's `datafree.models.generator.Generator` (a DCGAN-style decoder):
Linear(nz -> 2*ngf*(S/4)^2) -> BN -> up x2 -> conv3x3(2ngf, no bias) -> BN -> LeakyReLU(0.2) -> up x2 ->
conv3x3(ngf, no bias) -> BN -> LeakyReLU(0.2) -> conv3x3(channels) -> sigmoid, with the official
`reset_model` initialisation (weights N(0, 0.02), biases 0, BN scale N(1, 0.02), BN bias 0). Its batch norm
always uses the statistics of the current batch (the official generator stays in train mode).

Clients and the server are the foundation's classifiers (`iclr24_jax.vision.models`). A `ClientSet` holds
either one architecture with parameters stacked on a leading client axis (evaluated with `jax.vmap`, or
unrolled, see `ClientSet.vmap`) or a tuple of different architectures (heterogeneous clients, unrolled).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.vision.models import create_model


def _normal(std: float, mean: float = 0.0):
  def init(key, shape, dtype=jnp.float32):
    return mean + std * jax.random.normal(key, shape, dtype)
  return init


class Generator(nn.Module):
  """DCGAN-style generator of the official code (`Generator(nz=256, ngf=64, img_size=32, nc)`).

  Attributes:
    image_size: output height = width (a multiple of 4: 8 for digits, 28 for MNIST, 32 for CIFAR).
    channels: output channels.
    ngf: base width (official 64).
  """

  image_size: int = 28
  channels: int = 1
  ngf: int = 64

  @nn.compact
  def __call__(self, z: jax.Array) -> jax.Array:
    """Maps latents z [B, nz] to images [B, S, S, channels] in (0, 1)."""
    if self.image_size % 4:
      raise ValueError(f"Generator.image_size must be a multiple of 4 (got {self.image_size}).")
    s0 = self.image_size // 4
    w_init, b_init = _normal(0.02), nn.initializers.zeros
    bn = lambda: nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5,
                              scale_init=_normal(0.02, 1.0), bias_init=nn.initializers.zeros)
    h = nn.Dense(2 * self.ngf * s0 * s0, kernel_init=w_init, bias_init=b_init)(z)
    h = h.reshape(z.shape[0], s0, s0, 2 * self.ngf)
    h = bn()(h)
    h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)  # nn.Upsample(scale_factor=2), nearest
    h = nn.Conv(2 * self.ngf, (3, 3), padding="SAME", use_bias=False, kernel_init=w_init)(h)
    h = nn.leaky_relu(bn()(h), 0.2)
    h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)
    h = nn.Conv(self.ngf, (3, 3), padding="SAME", use_bias=False, kernel_init=w_init)(h)
    h = nn.leaky_relu(bn()(h), 0.2)
    h = nn.Conv(self.channels, (3, 3), padding="SAME", kernel_init=w_init, bias_init=b_init)(h)
    return nn.sigmoid(h)


@functools.lru_cache(maxsize=32)   # eval_shape traces the generator: once per setting
def _generator_shapes(generator: Generator, nz: int):
  return jax.eval_shape(lambda: generator.init(jax.random.key(0), jnp.zeros((2, nz), jnp.float32)))


def init_generator(key: jax.Array, generator: Generator, nz: int) -> dict:
  """Fresh generator variables ({'params', 'batch_stats'}) with the official `reset_model` initialisation.

  Co-Boosting re-initialises the generator at the start of every epoch (official `reset_model`): conv and
  linear weights N(0, 0.02), biases 0, BN scales N(1, 0.02), BN shifts 0. All random leaves come from one
  normal draw (the same distribution as the module's initialisers, but one RNG kernel instead of one per
  tensor, which keeps the compiled re-initialisation small on CPU).

  Args:
    key: PRNG key of the one normal draw.
    generator: the Generator module.
    nz: latent width (z is [B, nz]).

  Returns:
    {'params': ..., 'batch_stats': ...} with the shapes `generator.init` gives for z [2, nz].
  """
  shapes = _generator_shapes(generator, nz)
  flat, treedef = jax.tree_util.tree_flatten_with_path(shapes)

  def kind(path) -> str:
    names = [getattr(p, "key", "") for p in path]
    if names[0] == "batch_stats":
      return "ones" if names[-1] == "var" else "zeros"
    if names[-1] in ("kernel",):
      return "normal0"
    if names[-1] == "scale":
      return "normal1"
    return "zeros"

  kinds = [kind(path) for path, _ in flat]
  sizes = [int(np.prod(s.shape)) if k.startswith("normal") else 0 for k, (_, s) in zip(kinds, flat)]
  # official: rong-dai/Co-Boosting@b95d715 datafree/synthesis/coboost.py:194-202 (reset_model)
  noise = 0.02 * jax.random.normal(key, (max(sum(sizes), 1),), jnp.float32)
  leaves, offset = [], 0
  for k, (_, s), n in zip(kinds, flat, sizes):
    if k == "zeros":
      leaves.append(jnp.zeros(s.shape, s.dtype))
    elif k == "ones":
      leaves.append(jnp.ones(s.shape, s.dtype))
    else:
      leaves.append((noise[offset:offset + n].reshape(s.shape) + (1.0 if k == "normal1" else 0.0)).astype(s.dtype))
      offset += n
  return jax.tree_util.tree_unflatten(treedef, leaves)


def generate(generator: Generator, variables: dict, z: jax.Array) -> jax.Array:
  """Images [B, S, S, C] from latents [B, nz]; batch norm uses this batch's statistics (train mode)."""
  out, _ = generator.apply(variables, z, mutable=["batch_stats"])
  return out


@dataclasses.dataclass(frozen=True)
class ClientSet:
  """The client models of the ensemble (static; hashable, so jitted functions can close over it).

  Attributes:
    models: one Linen classifier when `stacked` (all clients share it, params have a leading client
      axis), else one model per client (heterogeneous architectures; params are a tuple).
    num_clients: C.
    stacked: identical architectures with stacked params.
    vmap: evaluate stacked clients with `jax.vmap` (one batched program). False unrolls a Python loop over
      the client axis inside the compiled function, which is faster on CPU, where vmapped convolutions
      become grouped convolutions (see the benchmark).
  """

  models: tuple
  num_clients: int
  stacked: bool = True
  vmap: bool = True

  def __post_init__(self):
    if self.stacked and len(self.models) != 1:
      raise ValueError("a stacked ClientSet has exactly one model (shared by every client).")
    if not self.stacked and len(self.models) != self.num_clients:
      raise ValueError(f"a heterogeneous ClientSet needs one model per client ({len(self.models)} models for "
                       f"{self.num_clients} clients).")

  def model(self, i: int) -> nn.Module:
    return self.models[0] if self.stacked else self.models[i]

  def client_params(self, params: Any, i: int) -> Any:
    """The params of client i (a slice of the stacked tree, or the i-th tuple entry)."""
    return jax.tree.map(lambda p: p[i], params) if self.stacked else params[i]

  def logits(self, params: Any, x: jax.Array) -> jax.Array:
    """Per-client logits [C, B, K] of inputs x [B, ...] (pure; differentiable w.r.t. x and params)."""
    if self.stacked and self.vmap:
      model = self.models[0]
      return jax.vmap(lambda p: model.apply({"params": p}, x))(params)
    return jnp.stack([self.model(i).apply({"params": self.client_params(params, i)}, x)
                      for i in range(self.num_clients)])


def stack_params(params_list: Sequence[Any]) -> Any:
  """Stacks C identically-shaped param trees into one tree with a leading client axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *params_list)


def unstack_params(stacked: Any, num_clients: int) -> list:
  """The inverse of `stack_params`."""
  return [jax.tree.map(lambda p: p[i], stacked) for i in range(num_clients)]


def fedavg_params(stacked: Any, sizes: Sequence[int] | None = None) -> Any:
  """One-round FedAvg: the (optionally data-size weighted) mean of stacked client params.

  Args:
    stacked: params with a leading client axis [C, ...].
    sizes: client data sizes [C]; None gives the plain mean (the official `average_weights`).
  """
  if sizes is None:
    return jax.tree.map(lambda p: jnp.mean(p, axis=0), stacked)
  w = jnp.asarray(sizes, jnp.float32)
  w = w / jnp.sum(w)
  return jax.tree.map(lambda p: jnp.tensordot(w, p, axes=1), stacked)


def client_models(model_configs: Sequence[Any], num_clients: int, num_classes: int) -> list[nn.Module]:
  """One classifier per client, cycling through `model_configs` (one config = identical clients)."""
  if not model_configs:
    raise ValueError("need at least one client model config.")
  return [create_model(model_configs[i % len(model_configs)], num_classes) for i in range(num_clients)]
