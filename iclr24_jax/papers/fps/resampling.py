"""Resampling schemes for particle filters (Douc & Cappe 2005) and the effective sample size.

All take normalised or unnormalised log-weights [M] and return ancestor indices [N] (int32); each is unbiased:
E[#copies of particle i] = N w_i. Systematic and stratified resampling have lower variance than multinomial
(systematic gives every particle floor(N w_i) or ceil(N w_i) copies).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

SCHEMES = ("multinomial", "systematic", "stratified")


def normalise(log_weights: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(log W [M] normalised to sum 1, log sum exp of the input) in log space."""
  lse = jax.nn.logsumexp(log_weights)
  return log_weights - lse, lse


def ess(log_weights: jax.Array) -> jax.Array:
  """Effective sample size 1 / sum W_i^2 of (unnormalised) log-weights [M] -> scalar in [1, M]."""
  log_w, _ = normalise(log_weights)
  return jnp.exp(-jax.nn.logsumexp(2.0 * log_w))


def _inverse_cdf(log_weights: jax.Array, u: jax.Array) -> jax.Array:
  w = jnp.exp(normalise(log_weights)[0])
  cdf = jnp.cumsum(w)
  cdf = cdf / cdf[-1]
  idx = jnp.searchsorted(cdf, u, side="right", method="sort")
  return jnp.clip(idx, 0, log_weights.shape[0] - 1).astype(jnp.int32)


def multinomial(key: jax.Array, log_weights: jax.Array, num: int | None = None) -> jax.Array:
  """N i.i.d. draws from Categorical(W) (the official FPS code: `random.choices(..., weights, k=M)`).

  Drawn by inverting the CDF at N i.i.d. uniforms: O(N log M), where `jax.random.categorical` with a sample
  shape would build an N x M Gumbel array.

  Args:
    key: PRNG key.
    log_weights: [M] unnormalised log-weights.
    num: N, draws (None: M).

  Returns:
    int32 [N] ancestor indices in [0, M).
  """
  num = log_weights.shape[0] if num is None else num
  return _inverse_cdf(log_weights, jax.random.uniform(key, (num,)))


def systematic(key: jax.Array, log_weights: jax.Array, num: int | None = None) -> jax.Array:
  """One uniform U, points (i + U) / N, inverted through the weights' CDF.

  Args:
    key: PRNG key.
    log_weights: [M] unnormalised log-weights.
    num: N, draws (None: M).

  Returns:
    int32 [N] ancestor indices in [0, M), non-decreasing.
  """
  num = log_weights.shape[0] if num is None else num
  u = (jnp.arange(num) + jax.random.uniform(key)) / num
  return _inverse_cdf(log_weights, u)


def stratified(key: jax.Array, log_weights: jax.Array, num: int | None = None) -> jax.Array:
  """One uniform per stratum: (i + U_i) / N, inverted through the CDF.

  Args:
    key: PRNG key.
    log_weights: [M] unnormalised log-weights.
    num: N, draws (None: M).

  Returns:
    int32 [N] ancestor indices in [0, M), non-decreasing.
  """
  num = log_weights.shape[0] if num is None else num
  u = (jnp.arange(num) + jax.random.uniform(key, (num,))) / num
  return _inverse_cdf(log_weights, u)


def resample(key: jax.Array, log_weights: jax.Array, scheme: str = "multinomial", num: int | None = None
             ) -> jax.Array:
  """Ancestor indices [num] by `scheme` ('multinomial' | 'systematic' | 'stratified').

  Args:
    key: PRNG key.
    log_weights: [M] unnormalised log-weights.
    scheme: the resampling scheme.
    num: N, draws (None: M).

  Returns:
    int32 [N] ancestor indices in [0, M).

  Raises:
    ValueError: unknown scheme.
  """
  if scheme == "multinomial":
    return multinomial(key, log_weights, num)
  if scheme == "systematic":
    return systematic(key, log_weights, num)
  if scheme == "stratified":
    return stratified(key, log_weights, num)
  raise ValueError(f"unknown resampling scheme '{scheme}'; choose one of {SCHEMES}.")
