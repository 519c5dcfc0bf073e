"""Resampling schemes for particle filters (Douc & Cappe 2005) and the effective sample size.

All take normalised or unnormalised log-weights [M] and return ancestor indices [N] (int32); each is unbiased:
E[#copies of particle i] = N w_i. Systematic and stratified resampling have lower variance than multinomial
(systematic gives every particle floor(N w_i) or ceil(N w_i) copies).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from iclr24_jax.common import checks

SCHEMES = ("multinomial", "systematic", "stratified")


def _check_log_weights(where: str, log_weights) -> object:
  # [M] log-weights: no NaN / +inf, and at least one finite weight (an all -inf set has no distribution).
  checks.shapes(where, log_weights=(log_weights, "M"))
  checks.nonempty(where, "log_weights", jnp.shape(log_weights)[0], "particles")
  xp = checks.xp(log_weights)
  lw = xp.asarray(log_weights)
  return checks.require(where, ~xp.any(xp.isnan(lw) | (lw == xp.inf)) & xp.any(xp.isfinite(lw)),
                        checks.NonFiniteError, "log_weights must have no NaN / +inf and at least one finite entry "
                        "(an all -inf set of weights has no distribution).")


def normalise(log_weights: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(log W [M] normalised to sum 1, log sum exp of the input) in log space."""
  lse = jax.nn.logsumexp(log_weights)
  return log_weights - lse, lse


def ess(log_weights: jax.Array) -> jax.Array:
  """Effective sample size 1 / sum W_i^2 of (unnormalised) log-weights [M] -> scalar in [1, M] (NaN for NaN or
  all -inf weights under jit; eager calls raise)."""
  ok = _check_log_weights("fps.ess", log_weights)
  log_w, _ = normalise(log_weights)
  return checks.poison(jnp.exp(-jax.nn.logsumexp(2.0 * log_w)), ok)


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
    int32 [N] ancestor indices in [0, M) (-1 under jit for NaN / all -inf weights; eager calls raise).
  """
  ok = _check_log_weights("fps.multinomial", log_weights)
  num = log_weights.shape[0] if num is None else checks.static_int("fps.multinomial", "num", num, low=0)
  return checks.poison(_inverse_cdf(log_weights, jax.random.uniform(key, (num,))), ok, int_fill=-1)


def systematic(key: jax.Array, log_weights: jax.Array, num: int | None = None) -> jax.Array:
  """One uniform U, points (i + U) / N, inverted through the weights' CDF.

  Args:
    key: PRNG key.
    log_weights: [M] unnormalised log-weights.
    num: N, draws (None: M).

  Returns:
    int32 [N] ancestor indices in [0, M), non-decreasing (-1 under jit for NaN / all -inf weights).
  """
  ok = _check_log_weights("fps.systematic", log_weights)
  num = log_weights.shape[0] if num is None else checks.static_int("fps.systematic", "num", num, low=0)
  u = (jnp.arange(num) + jax.random.uniform(key)) / num
  return checks.poison(_inverse_cdf(log_weights, u), ok, int_fill=-1)


def stratified(key: jax.Array, log_weights: jax.Array, num: int | None = None) -> jax.Array:
  """One uniform per stratum: (i + U_i) / N, inverted through the CDF.

  Args:
    key: PRNG key.
    log_weights: [M] unnormalised log-weights.
    num: N, draws (None: M).

  Returns:
    int32 [N] ancestor indices in [0, M), non-decreasing (-1 under jit for NaN / all -inf weights).
  """
  ok = _check_log_weights("fps.stratified", log_weights)
  num = log_weights.shape[0] if num is None else checks.static_int("fps.stratified", "num", num, low=0)
  u = (jnp.arange(num) + jax.random.uniform(key, (num,))) / num
  return checks.poison(_inverse_cdf(log_weights, u), ok, int_fill=-1)


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
    StaticArgumentError: unknown scheme.
  """
  checks.choice("fps.resample", "scheme", scheme, SCHEMES, "resampling scheme")
  if scheme == "multinomial":
    return multinomial(key, log_weights, num)
  if scheme == "systematic":
    return systematic(key, log_weights, num)
  return stratified(key, log_weights, num)


def resample_unchecked(key: jax.Array, log_weights: jax.Array, scheme: str) -> jax.Array:
  """`resample` without the value checks, for filters whose weights are finite by construction (the check would
  run at every step of their scan)."""
  u = {"multinomial": lambda: jax.random.uniform(key, log_weights.shape),
       "systematic": lambda: (jnp.arange(log_weights.shape[0]) + jax.random.uniform(key)) / log_weights.shape[0],
       "stratified": lambda: (jnp.arange(log_weights.shape[0]) + jax.random.uniform(key, log_weights.shape))
       / log_weights.shape[0]}[scheme]()
  return _inverse_cdf(log_weights, u)
