"""The safeguard: abstention threshold for a target accuracy, coverage/accuracy, and concept confirmation.

Abstention (official `SelectiveClassifier.get_abstension_mask`): abstain when 1 - tau <= y_bar <= tau, i.e. an
instance is covered when its confidence max(y_bar, 1 - y_bar) > tau, and then predicted as 1[y_bar > 0.5].

Confirmation (Section 3.2; official `intervention.py`, `VarianceIntervention` / `RandomIntervention`): on the
abstained instances a human confirms concept k, its probability is replaced by the true 0/1 value, and the
threshold is applied again. The variance-greedy policy scores each (instance, concept) pair by the variance of
the propagated prediction over the outcome of the confirmation, with the other concepts still marginalised:

  score_k = p_k f1_k^2 + (1 - p_k) f0_k^2 - (p_k f1_k + (1 - p_k) f0_k)^2 = p_k (1 - p_k) (f1_k - f0_k)^2

(f1_k / f0_k: y_bar with p_k set to 1 / 0), and confirms the highest-scoring pairs under the budget.

Budget: two rules, `budget_mode=`
  * 'per_concept' (the default here): B_k = how many abstained instances may have concept k confirmed; greedy
    selection is "the B_k highest-scoring abstained instances of each concept".
  * 'global' (the official code's rule): one total budget B = sum_k B_k (unit cost per confirmation, the
    official default cost) spent in ONE greedy order over all (abstained instance, concept) pairs, so a concept
    whose confirmations move predictions more can take more than its share.
Pairs are not re-scored after each confirmation in either rule (neither are they in the official code).
Deviation: with `exhaust_intervention_budget` the official code spends what is left on non-abstained
instances; here only abstained instances are ever confirmed (a covered instance's prediction cannot gain
coverage).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers.safeguards import propagation


def confidence(y_bar: jax.Array) -> jax.Array:
  """max(y_bar, 1 - y_bar): [B] -> [B]."""
  return jnp.maximum(y_bar, 1.0 - y_bar)


def abstain_mask(y_bar: jax.Array, tau: jax.Array | float) -> jax.Array:
  """[B] bool: abstain where 1 - tau <= y_bar <= tau."""
  return confidence(y_bar) <= tau


def coverage_accuracy(y_bar: jax.Array, y: jax.Array, tau: jax.Array | float,
                      weights: jax.Array | None = None) -> dict[str, jax.Array]:
  """Coverage and selective accuracy of the thresholded predictor.

  Args:
    y_bar: [B] Pr(y = 1 | x).
    y: [B] binary labels.
    tau: abstention threshold in [0.5, 1].
    weights: optional [B] 0/1 validity mask (padding).

  Returns:
    {'coverage': fraction of (valid) instances covered, 'accuracy': accuracy on the covered ones (NaN when
      nothing is covered), 'num_covered': count}.
  """
  y_bar = jnp.asarray(y_bar)
  w = jnp.ones_like(y_bar) if weights is None else jnp.asarray(weights, y_bar.dtype)
  covered = (~abstain_mask(y_bar, tau)).astype(y_bar.dtype) * w
  correct = ((y_bar > 0.5) == (jnp.asarray(y) > 0)).astype(y_bar.dtype)
  n_cov = covered.sum()
  acc = jnp.where(n_cov > 0, (covered * correct).sum() / jnp.maximum(n_cov, 1.0), jnp.nan)
  return {"coverage": n_cov / jnp.maximum(w.sum(), 1.0), "accuracy": acc, "num_covered": n_cov}


def choose_threshold(y_bar_val: jax.Array, y_val: jax.Array, target_accuracy: float) -> jax.Array:
  """The smallest threshold tau (largest coverage) whose selective accuracy on validation meets the target.

  Candidates are 0.5 and every validation confidence; a candidate t covers the instances with confidence > t.
  Covering nothing (t = the largest confidence) is always feasible (vacuous accuracy 1), so a tau always exists.
  The returned tau is the midpoint between the chosen candidate and the next larger validation confidence (same
  validation decisions, robust to ties). O(B log B): one sort and a cumulative sum.

  Args:
    y_bar_val: [B] validation Pr(y = 1 | x).
    y_val: [B] binary validation labels.
    target_accuracy: required accuracy on the covered instances, in (0, 1].

  Returns:
    Scalar tau in [0.5, 1].
  """
  if not isinstance(target_accuracy, jax.core.Tracer) and not 0.0 < float(target_accuracy) <= 1.0:
    raise ValueError(f"target_accuracy={target_accuracy} must lie in (0, 1].")
  if np.ndim(y_bar_val) != 1 or np.shape(y_bar_val) != np.shape(y_val):
    raise ValueError(f"y_bar_val {np.shape(y_bar_val)} and y_val {np.shape(y_val)} must be matching [B] vectors.")
  y_bar_val = jnp.asarray(y_bar_val)
  conf = confidence(y_bar_val)
  correct = ((y_bar_val > 0.5) == (jnp.asarray(y_val) > 0)).astype(jnp.float32)
  order = jnp.argsort(-conf)
  conf_desc = conf[order]
  cum_correct = jnp.concatenate([jnp.zeros((1,)), jnp.cumsum(correct[order])])     # [B + 1]
  candidates = jnp.concatenate([jnp.full((1,), 0.5, conf.dtype), conf])             # [B + 1]
  # number of instances with confidence strictly greater than t (ties are abstained together)
  n_cov = conf.shape[0] - jnp.searchsorted(conf_desc[::-1], candidates, side="right")
  acc = jnp.where(n_cov > 0, cum_correct[n_cov] / jnp.maximum(n_cov, 1), 1.0)
  feasible = acc >= target_accuracy - 1e-7
  best = jnp.min(jnp.where(feasible, candidates, jnp.inf))
  # Return the midpoint between the chosen candidate and the next larger confidence: the validation decisions are
  # the same, but test instances whose confidence equals a validation value (discrete detectors make many ties)
  # are no longer decided by the last bit of a float.
  above = jnp.min(jnp.where(conf > best, conf, jnp.inf))
  return jnp.where(jnp.isfinite(above), 0.5 * (best + above), best)


def confirmation_scores(concept_probs: jax.Array, front_end_params: Any, method: str = "exact",
                        key: jax.Array | None = None, num_samples: int = 1000,
                        front_end_fn: propagation.FrontEndFn | None = None) -> jax.Array:
  """Variance-greedy score of confirming each concept on each instance.

  Args:
    concept_probs: [B, K] probabilities.
    front_end_params, method, key, num_samples, front_end_fn: as in `propagation.propagate`.

  Returns:
    [B, K] scores p (1 - p) (f1 - f0)^2 >= 0.
  """
  p = jnp.asarray(concept_probs)
  f0, f1 = propagation.concept_outcomes(p, front_end_params, method, key, num_samples, front_end_fn)
  # p f1^2 + (1-p) f0^2 - (p f1 + (1-p) f0)^2 == p (1-p) (f1 - f0)^2; the factored form is exact at p in {0, 1}
  # and never negative in floating point.
  return p * (1.0 - p) * (f1 - f0) ** 2


def _per_concept_budget(budget_per_concept: Any, num_concepts: int) -> jax.Array:
  b = jnp.asarray(budget_per_concept)
  if b.ndim not in (0, 1) or (b.ndim == 1 and b.shape[0] != num_concepts):
    raise ValueError(f"budget_per_concept must be a scalar or [K={num_concepts}] counts; got shape {b.shape}.")
  if not isinstance(b, jax.core.Tracer) and bool(jnp.any(b < 0)):
    raise ValueError(f"budget_per_concept must be >= 0; got {np.asarray(b)}.")
  return jnp.broadcast_to(b, (num_concepts,)).astype(jnp.int32)


def select_top_per_concept(scores: jax.Array, abstain: jax.Array, budget_per_concept: Any) -> jax.Array:
  """For each concept k, marks the B_k highest-scoring abstained instances.

  Args:
    scores: [B, K] scores (higher = confirm first).
    abstain: [B] bool abstention mask.
    budget_per_concept: scalar or [K] integer budgets.

  Returns:
    [B, K] bool mask; column k has min(B_k, #abstained) entries, all on abstained rows.
  """
  num_rows, k = scores.shape
  budget = _per_concept_budget(budget_per_concept, k)
  masked = jnp.where(abstain[:, None], scores, -jnp.inf)
  order = jnp.argsort(-masked, axis=0, stable=True)                   # [B, K] row indices, best first
  ranks = jnp.zeros((num_rows, k), jnp.int32).at[order, jnp.arange(k)[None, :]].set(
      jnp.broadcast_to(jnp.arange(num_rows, dtype=jnp.int32)[:, None], (num_rows, k)))
  return (ranks < budget[None, :]) & abstain[:, None]


def select_top_global(scores: jax.Array, abstain: jax.Array, total_budget: Any) -> jax.Array:
  """Marks the `total_budget` highest-scoring (abstained instance, concept) pairs in one global order.

  The official confirmation budget (`intervention.py`): one greedy order over all pairs, unit cost each.

  Args:
    scores: [B, K] scores (higher = confirm first).
    abstain: [B] bool abstention mask.
    total_budget: scalar integer number of confirmations.

  Returns:
    [B, K] bool mask with min(total_budget, K * #abstained) entries, all on abstained rows.
  """
  num_rows, k = scores.shape
  budget = jnp.asarray(total_budget)
  if budget.ndim != 0:
    raise ValueError(f"total_budget must be a scalar count; got shape {budget.shape}.")
  if not isinstance(budget, jax.core.Tracer) and int(budget) < 0:
    raise ValueError(f"total_budget must be >= 0; got {int(budget)}.")
  flat = jnp.where(abstain[:, None], scores, -jnp.inf).reshape(-1)                # [B * K]
  order = jnp.argsort(-flat, stable=True)
  ranks = jnp.zeros((num_rows * k,), jnp.int32).at[order].set(jnp.arange(num_rows * k, dtype=jnp.int32))
  return (ranks.reshape(num_rows, k) < budget.astype(jnp.int32)) & abstain[:, None]


BUDGET_MODES = ("per_concept", "global")


def confirm(concept_probs: jax.Array, front_end_params: Any, abstain_mask: jax.Array, budget_per_concept: Any,
            strategy: str = "variance", key: jax.Array | None = None, method: str = "exact",
            num_samples: int = 1000, front_end_fn: propagation.FrontEndFn | None = None,
            budget_mode: str = "per_concept") -> jax.Array:
  """Chooses which (instance, concept) pairs a human confirms.

  Args:
    concept_probs: [B, K] concept probabilities.
    front_end_params: front-end parameters.
    abstain_mask: [B] bool, True where the safeguard abstains; only these rows are confirmed.
    budget_per_concept: scalar or [K] number of abstained instances per concept that may be confirmed.
    strategy: 'variance' (greedy by the variance score) or 'random' (uniformly random pairs; needs `key`).
    key: PRNG key for 'random' (and for method='mc' scores).
    method: propagation used for the variance scores ('exact' or 'mc').
    num_samples: Monte Carlo samples when method='mc'.
    front_end_fn: front-end model (default logistic).
    budget_mode: 'per_concept' (B_k confirmations of concept k) or 'global' (sum_k B_k confirmations in one
      greedy order over all pairs, the official rule).

  Returns:
    [B, K] bool confirmation mask.
  """
  if budget_mode not in BUDGET_MODES:
    raise ValueError(f"unknown budget_mode '{budget_mode}'; choose one of {BUDGET_MODES}.")
  propagation.check_concept_probs(concept_probs)
  p = jnp.asarray(concept_probs)
  abstain = jnp.asarray(abstain_mask, bool)
  if abstain.shape != p.shape[:1]:
    raise ValueError(f"abstain_mask has shape {abstain.shape}; it must be [B={p.shape[0]}].")
  if strategy == "variance":
    scores = confirmation_scores(p, front_end_params, method, key, num_samples, front_end_fn)
  elif strategy == "random":
    if key is None:
      raise ValueError("strategy='random' needs a PRNG key: confirm(..., strategy='random', key=jax.random.key(0)).")
    scores = jax.random.uniform(key, p.shape)
  else:
    raise ValueError(f"unknown confirmation strategy '{strategy}'; choose 'variance' or 'random'.")
  if budget_mode == "global":
    return select_top_global(scores, abstain, _per_concept_budget(budget_per_concept, p.shape[1]).sum())
  return select_top_per_concept(scores, abstain, budget_per_concept)


def apply_confirmation(concept_probs: jax.Array, confirmed: jax.Array, true_concepts: jax.Array) -> jax.Array:
  """Replaces confirmed concept probabilities by the true 0/1 concepts: [B, K] -> [B, K]."""
  return jnp.where(confirmed, jnp.asarray(true_concepts, jnp.asarray(concept_probs).dtype), concept_probs)
