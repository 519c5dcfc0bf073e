"""Uni-O4 networks: the Gaussian policy of the official code, Q / V critics, an ensemble dynamics model, and
helpers to initialise ensembles as stacked params (leading axis K) for `jax.vmap`.

Official code (Lei-Kun/Uni-O4, net.py / models/dynamics_model.py):
- policy `GaussPolicyMLP`: ReLU MLP 256 x 3 -> 2A, a final tanh; mean = first half (in [-1, 1]), log-std = the
  second half mapped affinely from [-1, 1] to [-5, 0]; `Normal(mean, std)` over env actions, actions clamped
  to [-1, 1] when acting. Here: `GaussianPolicy` returns `rl.distributions.ClippedGaussian` (same density; the env
  receives clip(raw, -1, 1)).
- V: ReLU MLP 512 x 3 (`rl.networks.ValueNet`), Q: ReLU MLP 1024 x 2 on [s, a] (one head, or two for double Q).
- dynamics (from MOBILE): 7 Gaussian members, 4 x 200 swish layers, outputs (delta obs, reward) mean and
  log-variance soft-clamped between learned bounds, 5 elites.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from iclr24_jax.rl import distributions, networks


class GaussianPolicy(nn.Module):
  """obs [..., D] -> ClippedGaussian over [..., A] (the official GaussPolicyMLP).

  mean = tanh(h_mu) in [-1, 1]; log_std = lo + (hi - lo) (tanh(h_s) + 1) / 2 in [lo, hi] (state-dependent).

  Attributes:
    action_dim: A.
    hidden: hidden widths.
    activation: hidden activation ('relu' in the official code).
    log_std_bounds: (lo, hi) = (-5, 0) officially.
  """

  action_dim: int
  hidden: Sequence[int] = (256, 256, 256)
  activation: Any = "relu"
  log_std_bounds: tuple[float, float] = (-5.0, 0.0)

  @nn.compact
  def __call__(self, obs: jax.Array) -> distributions.ClippedGaussian:
    # Deviation: rl.networks.MLP initialises hidden layers orthogonal(sqrt 2); the official code uses gain 1.
    h = jnp.tanh(networks.MLP(tuple(self.hidden) + (2 * self.action_dim,), self.activation, out_scale=1.0)(obs))
    mean, t = jnp.split(h, 2, axis=-1)
    lo, hi = self.log_std_bounds
    log_std = lo + 0.5 * (hi - lo) * (t + 1.0)
    return distributions.ClippedGaussian(mean, log_std)


class QNetwork(nn.Module):
  """(obs [..., D], action [..., A]) -> Q [num_q, ...] (num_q independent MLP heads on [s, a])."""

  hidden: Sequence[int] = (1024, 1024)
  activation: Any = "relu"
  num_q: int = 1

  @nn.compact
  def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
    x = jnp.concatenate([obs, action], axis=-1)
    return jnp.stack([networks.MLP(tuple(self.hidden) + (1,), self.activation)(x)[..., 0]
                      for _ in range(self.num_q)])


class DynamicsMember(nn.Module):
  """One member of the dynamics ensemble: standardised [s, a] -> (mean, raw log-variance) of [delta s, r]."""

  out_dim: int
  hidden: Sequence[int] = (200, 200, 200, 200)
  activation: Any = "swish"

  @nn.compact
  def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    h = networks.MLP(tuple(self.hidden) + (2 * self.out_dim,), self.activation, out_scale=1.0)(x)
    return tuple(jnp.split(h, 2, axis=-1))


def soft_clamp(x: jax.Array, low: jax.Array, high: jax.Array) -> jax.Array:
  """MOBILE's differentiable clamp: high - softplus(high - x), then low + softplus(x - low)."""
  x = high - jax.nn.softplus(high - x)
  return low + jax.nn.softplus(x - low)


def stack_trees(trees: Sequence[Any]) -> Any:
  """Stacks a list of identical pytrees along a new leading axis [K, ...]."""
  if not trees:
    raise ValueError("stack_trees: got an empty list.")
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack_tree(tree: Any, index: int) -> Any:
  """Member `index` of a stacked pytree."""
  return jax.tree.map(lambda x: x[index], tree)


def ensemble_size(stacked: Any) -> int:
  """K of stacked params (the leading axis of every leaf)."""
  leaves = jax.tree.leaves(stacked)
  if not leaves:
    raise ValueError("ensemble params are empty.")
  k = leaves[0].shape[0]
  if any(l.shape[:1] != (k,) for l in leaves):
    raise ValueError("ensemble params must all share the leading ensemble axis K; stack them with stack_trees.")
  return int(k)


def init_ensemble(key: jax.Array, module: nn.Module, num: int, *example_inputs: jax.Array,
                  identical: bool = False) -> Any:
  """Initialises `num` members of a module as stacked params [num, ...].

  Args:
    key: PRNG key (member i uses split(key, num)[i]).
    module: the Flax module.
    num: ensemble size.
    *example_inputs: example inputs for `module.init`.
    identical: all members start from the first member's params (used to show where diversity comes from).

  Returns:
    The params pytree with leading axis `num`.
  """
  if num < 1:
    raise ValueError(f"ensemble size must be >= 1, got {num}.")
  keys = jax.random.split(key, num)
  if identical:
    first = module.init(keys[0], *example_inputs)["params"]
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (num,) + x.shape), first)
  return jax.vmap(lambda k: module.init(k, *example_inputs)["params"])(keys)


def policy_from_params(params: Any, hidden: Sequence[int] | None = None, activation: Any = "relu",
                       log_std_bounds: tuple[float, float] = (-5.0, 0.0)) -> GaussianPolicy:
  """The GaussianPolicy whose shapes match `params` (single or stacked [K, ...]).

  Widths are read from the Dense kernels (`MLP_0/Dense_i/kernel`); the activation and log-std bounds cannot be
  read from params and default to the official ones.
  """
  try:
    dense = params["MLP_0"]
    n = len(dense)
    widths = [dense[f"Dense_{i}"]["kernel"].shape[-1] for i in range(n)]
  except (KeyError, TypeError) as e:
    raise ValueError("policy params must come from unio4.GaussianPolicy ({'MLP_0': {'Dense_i': ...}}); pass "
                     "policy= explicitly for other modules.") from e
  if widths[-1] % 2:
    raise ValueError(f"policy output width {widths[-1]} is odd; a GaussianPolicy outputs 2 * action_dim.")
  return GaussianPolicy(widths[-1] // 2, tuple(hidden or widths[:-1]), activation, log_std_bounds)
