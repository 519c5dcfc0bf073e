"""Running observation statistics (mean / variance, merged batch-wise) and normalisation.

The statistics are a pytree (`RunningStats`) carried in the train state; `update` merges a batch with
Chan et al.'s parallel formula, so the result does not depend on how the data were split into batches
(up to float rounding).
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class RunningStats:
  """count [] float32, mean [*shape], m2 [*shape] (sum of squared deviations)."""

  count: jax.Array
  mean: jax.Array
  m2: jax.Array

  @property
  def var(self) -> jax.Array:
    return self.m2 / jnp.maximum(self.count, 1.0)

  @property
  def std(self) -> jax.Array:
    return jnp.sqrt(self.var)


def init(shape: tuple[int, ...]) -> RunningStats:
  """Empty statistics for observations of `shape` (normalises to the identity until updated)."""
  return RunningStats(jnp.zeros((), jnp.float32), jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32))


def update(stats: RunningStats, x: jax.Array, mask: jax.Array | None = None) -> RunningStats:
  """Merges a batch x [..., *shape] (leading dims are the batch) into the statistics.

  Args:
    stats: current statistics.
    x: the batch; its trailing dims must equal stats.mean.shape.
    mask: optional [...] weights in {0, 1} selecting which rows count.

  Returns:
    Updated RunningStats.
  """
  shape = stats.mean.shape
  if x.shape[x.ndim - len(shape):] != shape:
    raise ValueError(f"normalization.update: batch trailing shape {x.shape[x.ndim - len(shape):]} != stats {shape}.")
  x = x.reshape((-1,) + shape).astype(jnp.float32)
  w = jnp.ones(x.shape[:1], jnp.float32) if mask is None else mask.reshape(-1).astype(jnp.float32)
  wb = w.reshape((-1,) + (1,) * len(shape))
  n_b = jnp.sum(w)
  mean_b = jnp.sum(wb * x, axis=0) / jnp.maximum(n_b, 1.0)
  m2_b = jnp.sum(wb * jnp.square(x - mean_b), axis=0)
  n = stats.count + n_b
  delta = mean_b - stats.mean
  mean = stats.mean + delta * n_b / jnp.maximum(n, 1.0)
  m2 = stats.m2 + m2_b + jnp.square(delta) * stats.count * n_b / jnp.maximum(n, 1.0)
  return RunningStats(n, mean, m2)


def normalize(stats: RunningStats, x: jax.Array, clip: float = 10.0, eps: float = 1e-8) -> jax.Array:
  """(x - mean) / sqrt(var + eps), clipped to [-clip, clip]; identity while count == 0.

  Args:
    stats: RunningStats with mean / m2 [*shape].
    x: [..., *shape] observations.
    clip: clip bound (0 or None: no clipping).
    eps: added to the variance.

  Returns:
    [..., *shape] float normalised observations (x unchanged while stats.count == 0).
  """
  z = (x - stats.mean) / jnp.sqrt(stats.var + eps)
  z = jnp.clip(z, -clip, clip) if clip else z
  return jnp.where(stats.count > 0, z, x)


def denormalize(stats: RunningStats, z: jax.Array, eps: float = 1e-8) -> jax.Array:
  """Inverse of `normalize` (without its clipping): z * sqrt(var + eps) + mean.

  Args:
    stats: RunningStats with mean / m2 [*shape].
    z: [..., *shape] normalised values.
    eps: added to the variance (use the value given to `normalize`).

  Returns:
    [..., *shape] values in the original scale.
  """
  return z * jnp.sqrt(stats.var + eps) + stats.mean
