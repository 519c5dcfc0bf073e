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

from iclr24_jax.common import checks
from iclr24_jax.papers.safeguards import propagation


def _check_y_bar(where: str, name: str, y_bar: Any) -> Any:
  checks.dtype(where, name, y_bar, "float")
  return checks.probabilities(where, name, y_bar, "pass the propagated Pr(y = 1 | x), not a logit.")


def _check_tau(where: str, tau: Any) -> Any:
  return checks.in_range(where, "tau", tau, 0.5, 1.0, hint="tau is the confidence threshold max(y_bar, 1 - y_bar) "
                         "> tau, so only [0.5, 1] is meaningful (tau < 0.5 would cover every instance).")


def _check_labels(where: str, name: str, y: Any) -> Any:
  checks.dtype(where, name, y, "real")
  return checks.labels_in(where, name, y, (0, 1), "binary labels, 1 for the positive class (map {-1, +1} "
                          "labels with (y + 1) // 2).")


def confidence(y_bar: jax.Array) -> jax.Array:
  """max(y_bar, 1 - y_bar): [...] -> [...] (NaN where y_bar is not a probability)."""
  ok = _check_y_bar("safeguards.confidence", "y_bar", y_bar)
  y_bar = jnp.asarray(y_bar)
  return checks.poison(jnp.maximum(y_bar, 1.0 - y_bar), ok)


def abstain_mask(y_bar: jax.Array, tau: jax.Array | float) -> jax.Array:
  """[...] bool: abstain where 1 - tau <= y_bar <= tau.

  Args:
    y_bar: [...] Pr(y = 1 | x) in [0, 1].
    tau: threshold in [0.5, 1] (a Python float is checked at once).

  Returns:
    [...] bool. Under jit / vmap, a y_bar outside [0, 1] (or NaN) or a traced tau outside [0.5, 1] abstains
    (True: the conservative sentinel); `iclr24_jax.checked` raises instead.
  """
  where = "safeguards.abstain_mask"
  ok = checks.all_ok(_check_y_bar(where, "y_bar", y_bar), _check_tau(where, tau))
  y_bar = jnp.asarray(y_bar)
  # official: hljames/conceptual_safeguards@c8b33a2 models/concept_bottleneck_model.py:40-44 (get_abstension_mask)
  return checks.poison(jnp.maximum(y_bar, 1.0 - y_bar) <= tau, ok, bool_fill=True)


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
      nothing is covered), 'num_covered': count}; all NaN under jit / vmap when y_bar is not a probability, y is
      not in {0, 1} or a traced tau is outside [0.5, 1] (eager calls raise).
  """
  where = "safeguards.coverage_accuracy"
  checks.shapes(where, y_bar=(y_bar, "B"), y=(y, "B"), weights=(weights, "B"))
  ok = checks.all_ok(_check_y_bar(where, "y_bar", y_bar), _check_labels(where, "y", y), _check_tau(where, tau))
  y_bar = jnp.asarray(y_bar)
  w = jnp.ones_like(y_bar) if weights is None else jnp.asarray(weights, y_bar.dtype)
  covered = (~(confidence(y_bar) <= tau)).astype(y_bar.dtype) * w
  correct = ((y_bar > 0.5) == (jnp.asarray(y) > 0)).astype(y_bar.dtype)
  n_cov = covered.sum()
  acc = jnp.where(n_cov > 0, (covered * correct).sum() / jnp.maximum(n_cov, 1.0), jnp.nan)
  return checks.poison({"coverage": n_cov / jnp.maximum(w.sum(), 1.0), "accuracy": acc, "num_covered": n_cov}, ok)


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
    Scalar tau in [0.5, 1]; NaN under jit / vmap when y_bar_val is not a probability, y_val is not in {0, 1} or
    a traced target_accuracy is outside (0, 1] (eager calls raise).
  """
  where = "safeguards.choose_threshold"
  checks.shapes(where, y_bar_val=(y_bar_val, "B"), y_val=(y_val, "B"))
  checks.nonempty(where, "y_bar_val", np.shape(y_bar_val)[0], "validation instances")
  ok = checks.all_ok(
      checks.in_range(where, "target_accuracy", target_accuracy, 0.0, 1.0, low_open=True),
      _check_y_bar(where, "y_bar_val", y_bar_val), _check_labels(where, "y_val", y_val))
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
  return checks.poison(jnp.where(jnp.isfinite(above), 0.5 * (best + above), best), ok)


def confirmation_scores(concept_probs: jax.Array, front_end_params: Any, method: str = "exact",
                        key: jax.Array | None = None, num_samples: int = 1000,
                        front_end_fn: propagation.FrontEndFn | None = None) -> jax.Array:
  """Variance-greedy score of confirming each concept on each instance.

  Args:
    concept_probs: [B, K] probabilities.
    front_end_params, method, key, num_samples, front_end_fn: as in `propagation.propagate`.

  Returns:
    [B, K] scores p (1 - p) (f1 - f0)^2 >= 0 (NaN under jit / vmap where concept_probs is not a probability).
  """
  f0, f1 = propagation.concept_outcomes(concept_probs, front_end_params, method, key, num_samples, front_end_fn)
  p = jnp.asarray(concept_probs)
  # p f1^2 + (1-p) f0^2 - (p f1 + (1-p) f0)^2 == p (1-p) (f1 - f0)^2; the factored form is exact at p in {0, 1}
  # and never negative in floating point.
  # official: hljames/conceptual_safeguards@c8b33a2 intervention.py:215-230 (VarianceIntervention.get_score)
  return p * (1.0 - p) * (f1 - f0) ** 2


def _per_concept_budget(budget_per_concept: Any, num_concepts: int, where: str = "safeguards.confirm"
                        ) -> tuple[jax.Array, Any]:
  b = checks.xp(budget_per_concept).asarray(budget_per_concept)
  if b.ndim not in (0, 1) or (b.ndim == 1 and b.shape[0] != num_concepts):
    raise checks.ShapeError(f"{where}: budget_per_concept must be a scalar or [K={num_concepts}] counts; got shape "
                            f"{b.shape}.")
  checks.dtype(where, "budget_per_concept", b, "real")
  ok = checks.require(where, b >= 0, checks.HyperparameterError, "budget_per_concept must be >= 0.")
  return jnp.broadcast_to(jnp.asarray(b), (num_concepts,)).astype(jnp.int32), ok


def select_top_per_concept(scores: jax.Array, abstain: jax.Array, budget_per_concept: Any) -> jax.Array:
  """For each concept k, marks the B_k highest-scoring abstained instances.

  Args:
    scores: [B, K] scores (higher = confirm first).
    abstain: [B] bool abstention mask.
    budget_per_concept: scalar or [K] integer budgets.

  Returns:
    [B, K] bool mask; column k has min(B_k, #abstained) entries, all on abstained rows (all False under jit
    for a negative traced budget).
  """
  where = "safeguards.select_top_per_concept"
  checks.shapes(where, scores=(scores, "B K"), abstain=(abstain, "B"))
  num_rows, k = scores.shape
  budget, ok = _per_concept_budget(budget_per_concept, k, where)
  masked = jnp.where(abstain[:, None], scores, -jnp.inf)
  order = jnp.argsort(-masked, axis=0, stable=True)                   # [B, K] row indices, best first
  ranks = jnp.zeros((num_rows, k), jnp.int32).at[order, jnp.arange(k)[None, :]].set(
      jnp.broadcast_to(jnp.arange(num_rows, dtype=jnp.int32)[:, None], (num_rows, k)))
  return checks.poison((ranks < budget[None, :]) & abstain[:, None], ok, bool_fill=False)


def select_top_global(scores: jax.Array, abstain: jax.Array, total_budget: Any) -> jax.Array:
  """Marks the `total_budget` highest-scoring (abstained instance, concept) pairs in one global order.

  The official confirmation budget (`intervention.py`): one greedy order over all pairs, unit cost each.

  Args:
    scores: [B, K] scores (higher = confirm first).
    abstain: [B] bool abstention mask.
    total_budget: scalar integer number of confirmations.

  Returns:
    [B, K] bool mask with min(total_budget, K * #abstained) entries, all on abstained rows (all False under jit
    for a negative traced budget).
  """
  where = "safeguards.select_top_global"
  checks.shapes(where, scores=(scores, "B K"), abstain=(abstain, "B"))
  num_rows, k = scores.shape
  budget = checks.xp(total_budget).asarray(total_budget)
  if budget.ndim != 0:
    raise checks.ShapeError(f"{where}: total_budget must be a scalar count; got shape {budget.shape}.")
  ok = checks.require(where, budget >= 0, checks.HyperparameterError, "total_budget must be >= 0.")
  flat = jnp.where(abstain[:, None], scores, -jnp.inf).reshape(-1)                # [B * K]
  order = jnp.argsort(-flat, stable=True)
  ranks = jnp.zeros((num_rows * k,), jnp.int32).at[order].set(jnp.arange(num_rows * k, dtype=jnp.int32))
  return checks.poison((ranks.reshape(num_rows, k) < jnp.asarray(budget).astype(jnp.int32)) & abstain[:, None], ok,
                       bool_fill=False)


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
    [B, K] bool confirmation mask. Under jit / vmap, concept probabilities outside [0, 1] (or NaN) or a negative
    traced budget confirm nothing (an all-False mask; `iclr24_jax.checked` raises instead).
  """
  where = "safeguards.confirm"
  checks.choice(where, "budget_mode", budget_mode, BUDGET_MODES)
  checks.choice(where, "strategy", strategy, ("variance", "random"))
  ok = propagation.check_concept_probs(concept_probs, where=where)
  checks.shapes(where, concept_probs=(concept_probs, "B K"))
  p = jnp.asarray(concept_probs)
  abstain = jnp.asarray(abstain_mask, bool)
  if abstain.shape != p.shape[:1]:
    raise checks.ShapeError(f"{where}: abstain_mask has shape {abstain.shape}; it must be [B={p.shape[0]}].")
  budget, ok_budget = _per_concept_budget(budget_per_concept, p.shape[1], where)
  if strategy == "variance":
    scores = confirmation_scores(p, front_end_params, method, key, num_samples, front_end_fn)
  else:
    if key is None:
      raise checks.ContractError(f"{where}: strategy='random' needs a PRNG key: confirm(..., strategy='random', "
                                 "key=jax.random.key(0)).")
    scores = jax.random.uniform(key, p.shape)
  if budget_mode == "global":
    mask = select_top_global(scores, abstain, jnp.maximum(budget, 0).sum())
  else:
    mask = select_top_per_concept(scores, abstain, jnp.maximum(budget, 0))
  return checks.poison(mask, checks.all_ok(ok, ok_budget), bool_fill=False)


def apply_confirmation(concept_probs: jax.Array, confirmed: jax.Array, true_concepts: jax.Array) -> jax.Array:
  """Replaces confirmed concept probabilities by the true 0/1 concepts.

  Args:
    concept_probs: [..., K] probabilities.
    confirmed: [..., K] bool (`confirm`).
    true_concepts: [..., K] binary concepts.

  Returns:
    [..., K] (NaN under jit / vmap where the inputs are outside their domains; eager calls raise).
  """
  where = "safeguards.apply_confirmation"
  checks.shapes(where, concept_probs=(concept_probs, "... K"), confirmed=(confirmed, "... K"),
                true_concepts=(true_concepts, "... K"))
  checks.dtype(where, "confirmed", confirmed, "int_or_bool")
  ok = checks.all_ok(propagation.check_concept_probs(concept_probs, where=where),
                     _check_labels(where, "true_concepts", true_concepts))
  # official: hljames/conceptual_safeguards@c8b33a2 intervention.py:9-28 (intervene)
  out = jnp.where(confirmed, jnp.asarray(true_concepts, jnp.asarray(concept_probs).dtype), concept_probs)
  return checks.poison(out, ok)
