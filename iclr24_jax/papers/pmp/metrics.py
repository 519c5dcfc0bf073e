"""Fraud-detection metrics: ROC-AUC, F1-macro, G-mean (official `training_procedure/evaluate.py`), and the
validation-tuned decision threshold.

`auc_roc`, `f1_macro`, `gmean`, `evaluate` are pure jnp functions with an optional mask, so they run inside
`jax.jit` on padded arrays; `best_f1_threshold` is the official threshold rule (argmax of the fraud-class F1
along the precision-recall curve on the validation nodes), on the host.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks


def _mask(labels: jax.Array, mask: jax.Array | None) -> jax.Array:
  return jnp.ones(jnp.shape(labels), bool) if mask is None else jnp.asarray(mask, bool)


def _check_binary(where: str, labels, mask=None, **arrays):
  checks.shapes(where, labels=(labels, "N"), mask=(mask, "N"), **{k: (v, "N") for k, v in arrays.items()})
  checks.dtype(where, "labels", labels, "real")
  return checks.labels_in(where, "labels", labels, (0, 1), "binary labels, 1 = fraud (map {-1, +1} with "
                          "(y + 1) // 2).")


def auc_roc(scores: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Area under the ROC curve (Mann-Whitney statistic with ties counted 1/2, = sklearn's roc_auc_score).

  Args:
    scores: [N] float, higher = more likely positive (fraud).
    labels: [N] int/bool, 1 positive.
    mask: [N] bool, entries to use (None: all).

  Returns:
    scalar float32; NaN when the masked labels hold only one class (and under jit for labels outside {0, 1};
    eager calls raise).
  """
  ok = _check_binary("pmp.auc_roc", labels, mask, scores=scores)
  m = _mask(labels, mask)
  y = jnp.asarray(labels).astype(bool)
  pos, neg = y & m, ~y & m
  s = jnp.asarray(scores, jnp.float32)
  neg_sorted = jnp.sort(jnp.where(neg, s, jnp.inf))              # real negatives first, the rest at +inf
  below = jnp.searchsorted(neg_sorted, s, side="left").astype(jnp.float32)    # negatives scored lower
  upto = jnp.searchsorted(neg_sorted, s, side="right").astype(jnp.float32)    # ... lower or tied
  n_pos = jnp.sum(pos).astype(jnp.float32)
  n_neg = jnp.sum(neg).astype(jnp.float32)
  per_pos = 0.5 * (below + upto) / n_neg                         # P(neg < pos) + 1/2 P(tie), per positive
  return checks.poison(jnp.sum(jnp.where(pos, per_pos, 0.0)) / n_pos, ok)


def confusion(preds: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, ...]:
  """(tn, fp, fn, tp) counts of binary predictions, float32 scalars (NaN under jit for labels or predictions
  outside {0, 1}; eager calls raise)."""
  where = "pmp.confusion"
  ok = checks.all_ok(_check_binary(where, labels, mask, preds=preds),
                     checks.labels_in(where, "preds", preds, (0, 1), "binary predictions (scores >= threshold)."))
  m = _mask(labels, mask)
  p = jnp.asarray(preds).astype(bool)
  y = jnp.asarray(labels).astype(bool)
  tp = jnp.sum(p & y & m)
  fp = jnp.sum(p & ~y & m)
  fn = jnp.sum(~p & y & m)
  tn = jnp.sum(~p & ~y & m)
  return checks.poison(tuple(v.astype(jnp.float32) for v in (tn, fp, fn, tp)), ok)


def _safe_div(a, b):
  return jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), 0.0)


def f1_macro(preds: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Mean of the F1 of class 1 and of class 0 (sklearn f1_score(average='macro') when both classes occur).

  F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c), 0 when that denominator is 0.
  """
  tn, fp, fn, tp = confusion(preds, labels, mask)
  f1_pos = _safe_div(2 * tp, 2 * tp + fp + fn)
  f1_neg = _safe_div(2 * tn, 2 * tn + fn + fp)
  return 0.5 * (f1_pos + f1_neg)


def gmean(preds: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Geometric mean of the true-positive and true-negative rates, sqrt(TP TN / ((TP + FN)(TN + FP))) (official)."""
  tn, fp, fn, tp = confusion(preds, labels, mask)
  return jnp.sqrt(_safe_div(tp, tp + fn) * _safe_div(tn, tn + fp))


def evaluate(scores: jax.Array, labels: jax.Array, mask: jax.Array | None = None,
             threshold: float | jax.Array = 0.5) -> dict[str, jax.Array]:
  """The paper's three metrics on (masked) nodes.

  Args:
    scores: [N] fraud scores (probabilities).
    labels: [N] 0/1.
    mask: [N] bool nodes to score (e.g. the test nodes); None = all.
    threshold: predict fraud where score >= threshold (official `prob2pred`); tune it with best_f1_threshold
      on the validation nodes.

  Returns:
    dict(auc, f1_macro, gmean) of float32 scalars.
  """
  if np.ndim(scores) != 1 or np.shape(scores) != np.shape(labels):
    raise checks.ShapeError(f"pmp.evaluate: wants scores [N] and labels [N] of one shape; got {np.shape(scores)} "
                            f"and {np.shape(labels)} (pass the fraud-class probability, not [N, 2] logits).")
  scores = jnp.asarray(scores, jnp.float32)
  preds = scores >= threshold
  return {"auc": auc_roc(scores, labels, mask), "f1_macro": f1_macro(preds, labels, mask),
          "gmean": gmean(preds, labels, mask)}


def best_f1_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
  """The official threshold: the score that maximises the fraud-class F1 along the precision-recall curve.

  Equivalent to `thresholds[argmax(2PR/(P+R))]` of sklearn's precision_recall_curve (ties -> the smallest
  threshold), with F1 = 0 where P + R = 0 instead of NaN.

  Args:
    scores: [M] fraud scores of the validation nodes; labels: [M] 0/1.

  Returns:
    The threshold (predict fraud where score >= threshold).
  """
  where = "pmp.best_f1_threshold"
  scores = checks.host_array(where, "scores", scores, np.float64).ravel()
  labels = checks.host_array(where, "labels", labels).ravel()
  checks.labels_in(where, "labels", labels, (0, 1))
  labels = labels.astype(bool)
  if scores.shape != labels.shape or scores.size == 0:
    raise ValueError(f"best_f1_threshold needs non-empty scores and labels of one shape; got {scores.shape}, "
                     f"{labels.shape}.")
  n_pos = labels.sum()
  if n_pos == 0:
    raise ValueError("best_f1_threshold: no positive (fraud) node among the validation nodes; the F1 threshold "
                     "is undefined (use a larger validation split).")
  order = np.argsort(-scores, kind="stable")
  s, y = scores[order], labels[order]
  distinct = np.r_[np.where(np.diff(s))[0], s.size - 1]       # last index of each distinct score (descending)
  tp = np.cumsum(y)[distinct].astype(np.float64)
  fp = (distinct + 1) - tp
  precision = tp / (tp + fp)
  recall = tp / n_pos
  denom = precision + recall
  f1 = np.where(denom > 0, 2 * precision * recall / np.where(denom > 0, denom, 1.0), 0.0)
  thresholds = s[distinct]                                     # descending
  best = np.flatnonzero(f1 == f1.max())
  return float(thresholds[best].min())


# Compiled once per shape for host-side use (eager jnp would compile every op separately).
evaluate_jit = jax.jit(evaluate)
auc_roc_jit = jax.jit(auc_roc)


def multiclass_auc(probs: np.ndarray, labels: np.ndarray) -> float:
  """Macro one-vs-rest ROC-AUC over the classes that have both positives and negatives (host side).

  sklearn's roc_auc_score(multi_class='ovr') raises when a class is absent from the evaluated nodes (texas
  has a class with one node); here such classes are skipped.

  Args:
    probs: [M, C] class probabilities; labels: [M] int.
  """
  probs, labels = np.asarray(probs), np.asarray(labels)
  aucs = []
  for c in range(probs.shape[1]):
    y = labels == c
    if 0 < y.sum() < y.size:
      aucs.append(float(auc_roc_jit(probs[:, c], y)))
  return float(np.mean(aucs)) if aucs else float("nan")


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
  """Top-1 accuracy of [M, C] scores against [M] labels."""
  return float(np.mean(np.argmax(np.asarray(probs), -1) == np.asarray(labels)))


def multiclass_f1_macro(probs: np.ndarray, labels: np.ndarray) -> float:
  """Macro F1 of argmax predictions over the classes present in labels or predictions (sklearn's rule)."""
  preds, labels = np.argmax(np.asarray(probs), -1), np.asarray(labels)
  f1s = []
  for c in np.union1d(labels, preds):
    tp = np.sum((preds == c) & (labels == c))
    den = 2 * tp + np.sum((preds == c) & (labels != c)) + np.sum((preds != c) & (labels == c))
    f1s.append(2 * tp / den if den else 0.0)
  return float(np.mean(f1s))


def multiclass_gmean(probs: np.ndarray, labels: np.ndarray) -> float:
  """Geometric mean of the per-class recalls (classes present in labels); the binary G-mean for C = 2."""
  preds, labels = np.argmax(np.asarray(probs), -1), np.asarray(labels)
  recalls = [np.mean(preds[labels == c] == c) for c in np.unique(labels)]
  return float(np.prod(recalls) ** (1.0 / len(recalls)))
