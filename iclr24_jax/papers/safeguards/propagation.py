"""Uncertainty propagation through a front-end model on binary concepts (Section 3.1 of the paper).

  y_bar(x) = sum_{c in {0,1}^K} f(c) prod_k p_k^{c_k} (1 - p_k)^{1 - c_k}            (the propagation equation)

`method='exact'` enumerates all 2^K assignments in chunks (a `lax.scan` over chunks of assignments, each chunk
evaluated batched over its assignments, so K = 20 needs only [B, chunk] memory); `method='mc'` averages f over
`num_samples` concept vectors drawn from the independent Bernoullis.

Difference from the official code (`models/concept_bottleneck_model.py`, `PropagationCBM.update_all_cs_probas`):
the official code evaluates the front end on the assignment table as
`y_model.predict_proba(np.asarray(all_cs).reshape(-1, 1))`. `all_cs` is [2^K, K]; reshaping it to [K * 2^K, 1]
turns every single bit into its own one-feature example. For K = 1 that is right; for K > 1 a K-feature
scikit-learn model refuses the input (feature-count error), and a model that accepted it would give K * 2^K
per-bit scores of which `zip(all_cs, pred_probas)` pairs the first 2^K with the 2^K assignments, i.e. f is never
evaluated on a full concept vector. Here f is always evaluated on the full [chunk, K] assignment rows
(tested against brute-force enumeration for K = 1..4).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks

FrontEndFn = Callable[[Any, jax.Array], jax.Array]

MAX_EXACT_CONCEPTS = 24
_LOG_ZERO = -1e4  # log(0) stand-in: exp(-1e4) == 0 in float32, and 0 * -1e4 stays finite (no NaN).
_HIGHEST = jax.lax.Precision.HIGHEST


def logistic_front_end(params: Any, concepts: jax.Array) -> jax.Array:
  """The front-end model f(c) = sigmoid(w . c + b) (logistic regression on binary concepts).

  Args:
    params: {'w': [K], 'b': []}.
    concepts: [N, K] concept values (binary, or probabilities for a plug-in baseline).

  Returns:
    [N] Pr(y = 1 | c).
  """
  return jax.nn.sigmoid(jnp.dot(concepts, params["w"], precision=_HIGHEST) + params["b"])


def check_concept_probs(concept_probs: Any, name: str = "concept_probs", where: str = "safeguards") -> Any:
  """Checks concept probabilities [..., K] (the checks policy of `common.checks`).

  Structure (rank >= 1, a float dtype) raises at trace time. Values (NaN, outside [0, 1]) raise eagerly when this
  host can read them; under jit / vmap (or on a global array) the result is returned for `checks.poison`, so the
  caller's output is NaN instead of a finite wrong answer.

  Args:
    concept_probs: [..., K] Pr(c_k = 1 | x).
    name: its name in the messages.
    where: the public function's name in the messages.

  Returns:
    True, or the traced condition to poison the output with.
  """
  checks.shapes(where, **{name: (concept_probs, "... K")})
  checks.dtype(where, name, concept_probs, "real")
  ok_nan = checks.not_nan(where, name, concept_probs, "check the concept detectors' outputs (calibration on a "
                                                        "split with a single class gives NaN).")
  ok_range = checks.probabilities(where, name, concept_probs, "probabilities, not logits: apply jax.nn.sigmoid "
                                                              "to logits first.")
  return checks.all_ok(ok_nan, ok_range)


def _check_params(params: Any, num_concepts: int, front_end_fn: FrontEndFn | None, where: str) -> None:
  if front_end_fn is None:
    if not (isinstance(params, dict) and "w" in params and "b" in params):
      raise checks.ContractError(f"{where}: front_end_params must be {{'w': [K], 'b': []}} for the logistic front "
                                 "end (or pass front_end_fn for another model).")
    if np.shape(params["w"]) != (num_concepts,):
      raise checks.ShapeError(f"{where}: front_end_params['w'] has shape {np.shape(params['w'])} but concept_probs "
                              f"has K={num_concepts} columns; they must agree.")


def _rows(p: jax.Array) -> tuple[jax.Array, tuple[int, ...]]:
  """[..., K] -> ([N, K], leading shape): the per-row math runs on a flat batch."""
  return p.reshape((-1, p.shape[-1])), p.shape[:-1]


def assignments(num_concepts: int, start: jax.Array | int = 0, size: int | None = None,
                dtype=jnp.float32) -> jax.Array:
  """Rows start .. start+size-1 of the table of all binary concept vectors (bit k of the row index is c_k).

  Args:
    num_concepts: K.
    start: first row (may be traced).
    size: number of rows (default all 2^K).
    dtype: output dtype.

  Returns:
    [size, K] binary assignments.
  """
  size = 2 ** num_concepts if size is None else size
  idx = start + jnp.arange(size, dtype=jnp.int32)
  bits = jnp.arange(num_concepts, dtype=jnp.int32)
  return ((idx[:, None] >> bits[None, :]) & 1).astype(dtype)


def propagate_exact(concept_probs: jax.Array, front_end_params: Any, front_end_fn: FrontEndFn | None = None,
                    chunk_size: int = 4096) -> jax.Array:
  """Exact propagation by enumerating all 2^K concept assignments in chunks.

  Args:
    concept_probs: [B, K] Pr(c_k = 1 | x) in [0, 1].
    front_end_params: parameters of the front end.
    front_end_fn: f(params, c [N, K]) -> [N]; default `logistic_front_end`.
    chunk_size: assignments per chunk (a power of two); memory is O(B * chunk_size).

  Returns:
    [B] y_bar = E_{c ~ p}[f(c)] (NaN under jit / vmap where concept_probs is not a probability).
  """
  where = "safeguards.propagate_exact"
  checks.shapes(where, concept_probs=(concept_probs, "B K"))
  ok = check_concept_probs(concept_probs, where=where)
  fn = logistic_front_end if front_end_fn is None else front_end_fn
  p = jnp.asarray(concept_probs)
  p = p.astype(jnp.promote_types(p.dtype, jnp.float32))
  num_rows, k = p.shape
  if k > MAX_EXACT_CONCEPTS:
    raise checks.ShapeError(f"{where}: exact propagation over K={k} concepts needs 2^{k} assignments; use "
                            f"method='mc' (or K <= {MAX_EXACT_CONCEPTS}).")
  chunk_size = checks.static_int(where, "chunk_size", chunk_size, low=1)
  if chunk_size & (chunk_size - 1):
    raise checks.HyperparameterError(f"{where}: chunk_size={chunk_size} must be a power of two.")
  total = 2 ** k
  chunk = min(total, chunk_size)
  num_chunks = total // chunk
  # log w(c) = sum_k c_k log p_k + (1 - c_k) log(1 - p_k): one matmul per chunk of assignments.
  log_p = jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), _LOG_ZERO)
  log_1mp = jnp.where(p < 1, jnp.log1p(-jnp.where(p < 1, p, 0.0)), _LOG_ZERO)

  def body(acc, j):
    c = assignments(k, j * chunk, chunk, p.dtype)                             # [chunk, K]
    f = fn(front_end_params, c)                                                # [chunk]
    # Two matmuls rather than offset + (log p - log(1-p)) . c: the -1e4 stand-ins are only ever multiplied by
    # an exact 0 or added to assignments whose weight is 0, so no large terms cancel. Where every p_k is 0 or 1
    # the matching assignment has log_w == 0 exactly and the rest weight 0: y_bar = f(c) exactly.
    # official: hljames/conceptual_safeguards@c8b33a2 models/concept_bottleneck_model.py:555-566 (c_probability)
    log_w = (jnp.dot(log_p, c.T, precision=_HIGHEST)
             + jnp.dot(log_1mp, (1.0 - c).T, precision=_HIGHEST))             # [B, chunk]
    # official: hljames/conceptual_safeguards@c8b33a2 models/concept_bottleneck_model.py:623-642 (propagation)
    return acc + jnp.dot(jnp.exp(log_w), f, precision=_HIGHEST), None

  if num_chunks == 1:
    out, _ = body(jnp.zeros((num_rows,), p.dtype), 0)
    return checks.poison(out, ok)
  out, _ = jax.lax.scan(body, jnp.zeros((num_rows,), p.dtype), jnp.arange(num_chunks))
  return checks.poison(out, ok)


def propagate_mc(concept_probs: jax.Array, front_end_params: Any, key: jax.Array, num_samples: int = 1000,
                 front_end_fn: FrontEndFn | None = None, sample_chunk: int = 250, return_stderr: bool = False):
  """Monte Carlo propagation: the mean of f over concept vectors drawn from the independent Bernoullis.

  Args:
    concept_probs: [B, K] probabilities.
    front_end_params: front-end parameters.
    key: PRNG key (the same key gives the same draws: common random numbers across calls).
    num_samples: S, concept vectors per instance.
    front_end_fn: default `logistic_front_end`.
    sample_chunk: samples drawn per scan step (memory O(sample_chunk * B * K)).
    return_stderr: also return the standard error of each estimate.

  Returns:
    [B] estimates of y_bar (and [B] standard errors if `return_stderr`); NaN under jit / vmap where
    concept_probs is not a probability.
  """
  where = "safeguards.propagate_mc"
  checks.shapes(where, concept_probs=(concept_probs, "B K"))
  ok = check_concept_probs(concept_probs, where=where)
  fn = logistic_front_end if front_end_fn is None else front_end_fn
  num_samples = checks.static_int(where, "num_samples", num_samples, low=1)
  sample_chunk = checks.static_int(where, "sample_chunk", sample_chunk, low=1)
  p = jnp.asarray(concept_probs)
  p = p.astype(jnp.promote_types(p.dtype, jnp.float32))
  num_rows, k = p.shape
  chunk = min(num_samples, sample_chunk)
  num_chunks = -(-num_samples // chunk)

  def body(carry, j):
    s1, s2 = carry
    u = jax.random.uniform(jax.random.fold_in(key, j), (chunk, num_rows, k), p.dtype)
    # official: hljames/conceptual_safeguards@c8b33a2 models/concept_bottleneck_model.py:593-599 (MC propagation)
    c = (u < p[None]).astype(p.dtype)                                        # [chunk, B, K]
    f = fn(front_end_params, c.reshape(chunk * num_rows, k)).reshape(chunk, num_rows)
    valid = (j * chunk + jnp.arange(chunk)) < num_samples                    # the last chunk may overshoot
    f = jnp.where(valid[:, None], f, 0.0)
    return (s1 + f.sum(0), s2 + (f * f).sum(0)), None

  zeros = jnp.zeros((num_rows,), p.dtype)
  (s1, s2), _ = jax.lax.scan(body, (zeros, zeros), jnp.arange(num_chunks))
  mean = s1 / num_samples
  if not return_stderr:
    return checks.poison(mean, ok)
  var = jnp.maximum(s2 / num_samples - mean ** 2, 0.0) * num_samples / max(num_samples - 1, 1)
  return checks.poison((mean, jnp.sqrt(var / num_samples)), ok)


def propagate(concept_probs: jax.Array, front_end_params: Any, method: str = "exact", key: jax.Array | None = None,
              num_samples: int = 1000, front_end_fn: FrontEndFn | None = None, chunk_size: int = 4096
              ) -> jax.Array:
  """Propagates concept uncertainty through the front end: y_bar = E_{c ~ Bern(p)}[f(c)].

  Compile it once and reuse it (`method`, `num_samples`, `front_end_fn` and `chunk_size` are static):

    prop = jax.jit(safeguards.propagate, static_argnames=("method", "num_samples", "front_end_fn", "chunk_size"))
    y_bar = prop(concept_probs, front_end_params)

  Args:
    concept_probs: [..., K] calibrated concept probabilities Pr(c_k = 1 | x) (any leading batch dims).
    front_end_params: front-end parameters ({'w': [K], 'b': []} for the logistic front end).
    method: 'exact' (2^K enumeration, chunked) or 'mc' (Monte Carlo); static.
    key: PRNG key, required for 'mc'.
    num_samples: Monte Carlo samples per instance; static.
    front_end_fn: f(params, c [N, K]) -> [N]; default logistic regression; static.
    chunk_size: assignments per chunk for 'exact'; static.

  Returns:
    [...] Pr(y = 1 | x) after propagation. Probabilities outside [0, 1] or NaN raise `checks.ProbabilityError` /
    `NonFiniteError` when called eagerly; under jit / vmap the rows' outputs are NaN (use `iclr24_jax.checked`
    for the error inside jit).
  """
  where = "safeguards.propagate"
  ok = check_concept_probs(concept_probs, where=where)
  _check_params(front_end_params, np.shape(concept_probs)[-1], front_end_fn, where)
  checks.choice(where, "method", method, ("exact", "mc"), "propagation method")
  p, lead = _rows(jnp.asarray(concept_probs))
  if method == "exact":
    out = propagate_exact(p, front_end_params, front_end_fn, chunk_size)
  else:
    if key is None:
      raise checks.ContractError(f"{where}: method='mc' needs a PRNG key: propagate(..., method='mc', "
                                 "key=jax.random.key(0)).")
    out = propagate_mc(p, front_end_params, key, num_samples, front_end_fn)
  return checks.poison(out.reshape(lead), ok)


def concept_outcomes(concept_probs: jax.Array, front_end_params: Any, method: str = "exact",
                     key: jax.Array | None = None, num_samples: int = 1000,
                     front_end_fn: FrontEndFn | None = None) -> tuple[jax.Array, jax.Array]:
  """The propagated prediction after confirming concept k as 0 or as 1, the other concepts marginalised.

  f0[b, k] = y_bar(p with p_k := 0), f1[b, k] = y_bar(p with p_k := 1). Because y_bar is multilinear in p,
  y_bar = p_k f1 + (1 - p_k) f0 for every k (tested). With 'mc' all 2K evaluations share the same draws
  (common random numbers), so differences f1 - f0 are not swamped by sampling noise.

  Args:
    concept_probs: [B, K].
    front_end_params, method, key, num_samples, front_end_fn: as in `propagate`.

  Returns:
    (f0, f1), each [B, K] (NaN under jit / vmap where concept_probs is not a probability; see `propagate`).
  """
  where = "safeguards.concept_outcomes"
  ok = check_concept_probs(concept_probs, where=where)
  checks.shapes(where, concept_probs=(concept_probs, "B K"))
  checks.choice(where, "method", method, ("exact", "mc"), "propagation method")
  p = jnp.asarray(concept_probs)
  k = p.shape[1]
  eye = jnp.eye(k, dtype=bool)[:, None, :]                      # [K, 1, K]
  p0 = jnp.where(eye, 0.0, p[None]).astype(p.dtype)             # [K, B, K]: concept k set to 0
  p1 = jnp.where(eye, 1.0, p[None]).astype(p.dtype)
  stacked = jnp.concatenate([p0, p1])                           # [2K, B, K]
  if method == "exact":
    out = jax.vmap(lambda q: propagate_exact(q, front_end_params, front_end_fn))(stacked)
  else:
    if key is None:
      raise checks.ContractError(f"{where}: method='mc' needs a PRNG key.")
    out = jax.vmap(lambda q: propagate_mc(q, front_end_params, key, num_samples, front_end_fn))(stacked)
  return checks.poison((out[:k].T, out[k:].T), ok)
