"""Policy and value networks (Flax Linen): MLP torso, Gaussian / categorical heads, value head.

Params of an actor-critic are one dict `{'policy': ..., 'value': ...}` from two separate networks (no shared
torso, as in brax's and Uni-O4's PPO), so a paper can load a policy or value trained elsewhere into one half.
Initialisation follows PureJaxRL/CleanRL: orthogonal(sqrt 2) hidden layers, orthogonal(0.01) policy output,
orthogonal(1) value output, zero biases.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.rl import distributions

ACTIVATIONS: dict[str, Callable] = {"tanh": nn.tanh, "relu": nn.relu, "swish": nn.swish, "elu": nn.elu,
                                    "gelu": nn.gelu}


def activation_fn(name: str | Callable) -> Callable:
  """An activation function by name ('tanh', 'relu', 'swish', 'elu', 'gelu'); a callable is returned as is.

  Raises:
    ValueError: unknown name.
  """
  if callable(name):
    return name
  if name not in ACTIVATIONS:
    raise ValueError(f"unknown activation '{name}'; choose one of {sorted(ACTIVATIONS)}.")
  return ACTIVATIONS[name]


class MLP(nn.Module):
  """Dense layers with an activation between them; the last layer is linear.

  Attributes:
    features: widths of all layers, the output last.
    activation: name or callable.
    out_scale: orthogonal init scale of the last layer.
    layer_norm: LayerNorm after each hidden Dense.
  """

  features: Sequence[int]
  activation: Any = "tanh"
  out_scale: float = 1.0
  layer_norm: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    act = activation_fn(self.activation)
    for i, f in enumerate(self.features):
      last = i == len(self.features) - 1
      scale = self.out_scale if last else np.sqrt(2.0)
      x = nn.Dense(f, kernel_init=nn.initializers.orthogonal(scale), bias_init=nn.initializers.zeros)(x)
      if not last:
        if self.layer_norm:
          x = nn.LayerNorm()(x)
        x = act(x)
    return x


class GaussianPolicy(nn.Module):
  """obs [..., D] -> Gaussian over [..., A] (state-independent log-std by default).

  Attributes:
    action_dim: A.
    hidden: torso widths.
    squash: 'tanh', 'clip' or 'none' (see distributions.make_gaussian).
    state_dependent_std: predict log-std from the torso (else a learned vector).
    init_log_std: initial log-std.
    min_log_std, max_log_std: clamp of the log-std.
  """

  action_dim: int
  hidden: Sequence[int] = (64, 64)
  activation: Any = "tanh"
  squash: str = "tanh"
  state_dependent_std: bool = False
  init_log_std: float = 0.0
  min_log_std: float = -5.0
  max_log_std: float = 2.0

  @nn.compact
  def __call__(self, obs: jax.Array) -> distributions.Gaussian:
    out = self.action_dim * (2 if self.state_dependent_std else 1)
    h = MLP(tuple(self.hidden) + (out,), self.activation, out_scale=0.01)(obs)
    if self.state_dependent_std:
      mean, log_std = jnp.split(h, 2, axis=-1)
      log_std = log_std + self.init_log_std
    else:
      mean = h
      log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.action_dim,))
    log_std = jnp.clip(log_std, self.min_log_std, self.max_log_std)
    return distributions.make_gaussian(mean, log_std, self.squash)


class CategoricalPolicy(nn.Module):
  """obs [..., D] -> Categorical over num_actions."""

  num_actions: int
  hidden: Sequence[int] = (64, 64)
  activation: Any = "tanh"

  @nn.compact
  def __call__(self, obs: jax.Array) -> distributions.Categorical:
    return distributions.Categorical(MLP(tuple(self.hidden) + (self.num_actions,), self.activation,
                                         out_scale=0.01)(obs))


class ValueNet(nn.Module):
  """obs [..., D] -> V(obs) [...]."""

  hidden: Sequence[int] = (64, 64)
  activation: Any = "tanh"

  @nn.compact
  def __call__(self, obs: jax.Array) -> jax.Array:
    return MLP(tuple(self.hidden) + (1,), self.activation, out_scale=1.0)(obs)[..., 0]


class ActorCritic(nn.Module):
  """Separate policy and value networks; `__call__(obs) -> (distribution, value)`.

  Params: {'params': {'policy': ..., 'value': ...}}. One half alone: `apply(v, obs, method='pi')` or
  `method='v'`, or apply `module.policy` / `module.value` to `{'params': params['policy']}`.
  """

  policy: nn.Module
  value: nn.Module

  def __call__(self, obs: jax.Array):
    return self.policy(obs), self.value(obs)

  def pi(self, obs: jax.Array):
    """The policy's action distribution at obs [B, ...] (a distributions.* pytree with batch shape [B])."""
    return self.policy(obs)

  def v(self, obs: jax.Array) -> jax.Array:
    """The value estimates [B] at obs [B, ...]."""
    return self.value(obs)


def make_actor_critic(discrete: bool, action_dim: int, config: Any = None) -> ActorCritic:
  """Builds an ActorCritic from a network config.

  Args:
    discrete: categorical (True) or Gaussian (False) policy.
    action_dim: number of discrete actions or continuous action dimensions.
    config: mapping with optional policy_hidden, value_hidden, activation, squash ('tanh' | 'clip' | 'none'),
      state_dependent_std, init_log_std.

  Returns:
    The module (params {'policy': ..., 'value': ...}).
  """
  config = dict(config or {})
  act = config.get("activation", "tanh")
  ph = tuple(config.get("policy_hidden", (64, 64)))
  vh = tuple(config.get("value_hidden", (64, 64)))
  if discrete:
    pol = CategoricalPolicy(action_dim, ph, act)
  else:
    pol = GaussianPolicy(action_dim, ph, act, squash=config.get("squash", "tanh"),
                         state_dependent_std=bool(config.get("state_dependent_std", False)),
                         init_log_std=float(config.get("init_log_std", 0.0)))
  return ActorCritic(pol, ValueNet(vh, act))
