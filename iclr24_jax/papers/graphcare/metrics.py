"""Task metrics (numpy, host side) as the official evaluation computes them, and bootstrap intervals.

binary (mortality, readmission): AUROC, AUPRC (average precision), F1 / F1-macro, Jaccard, accuracy at 0.5.
multiclass (length of stay, 10 classes): accuracy, macro-F1, weighted-F1, Cohen's kappa, AUROC (one-vs-rest,
  weighted by support, over the classes present).
multilabel (drug recommendation): sample-averaged Jaccard, F1, AUPRC and AUROC at threshold 0.5
  (sklearn `average='samples'`, `zero_division=1`, as in the official `graphcare.py`).
Every function matches scikit-learn (tests/papers/graphcare/ checks it).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from iclr24_jax.common import checks

TASKS = ("binary", "multiclass", "multilabel")


def _rankdata(x: np.ndarray) -> np.ndarray:
  """Average ranks (1-based) with ties."""
  from scipy.stats import rankdata
  return rankdata(x, method="average")


def roc_auc(y_true: np.ndarray, y_score: np.ndarray) -> float:
  """Binary AUROC (Mann-Whitney U with tie correction); NaN if only one class is present."""
  y = np.asarray(y_true).astype(bool).ravel()
  s = np.asarray(y_score, np.float64).ravel()
  n_pos, n_neg = int(y.sum()), int((~y).sum())
  if n_pos == 0 or n_neg == 0:
    return float("nan")
  r = _rankdata(s)
  return float((r[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def average_precision(y_true: np.ndarray, y_score: np.ndarray) -> float:
  """AUPRC as sklearn's average_precision_score: sum_n (R_n - R_{n-1}) P_n over score thresholds.

  With no positive labels sklearn returns -0.0 (recall undefined); we return NaN there instead, and the
  sample-averaged multilabel version skips such rows only where sklearn would too (see `multilabel_metrics`).
  """
  y = np.asarray(y_true).astype(bool).ravel()
  s = np.asarray(y_score, np.float64).ravel()
  if y.sum() == 0:
    return float("nan")
  order = np.argsort(-s, kind="mergesort")
  s, y = s[order], y[order]
  distinct = np.where(np.diff(s))[0]
  thr = np.r_[distinct, len(s) - 1]
  tps = np.cumsum(y)[thr]
  fps = (thr + 1) - tps
  precision = tps / (tps + fps)
  recall = tps / tps[-1]
  recall_prev = np.r_[0.0, recall[:-1]]
  return float(np.sum((recall - recall_prev) * precision))


def _prf(tp: float, fp: float, fn: float, zero_division: float) -> tuple[float, float, float]:
  p = tp / (tp + fp) if tp + fp > 0 else zero_division
  r = tp / (tp + fn) if tp + fn > 0 else zero_division
  f = 2 * tp / (2 * tp + fp + fn) if (2 * tp + fp + fn) > 0 else zero_division
  return p, r, f


def f1_binary(y_true, y_pred, zero_division: float = 0.0) -> float:
  """F1 of the positive class."""
  y, p = np.asarray(y_true).astype(bool), np.asarray(y_pred).astype(bool)
  return _prf(float((y & p).sum()), float((~y & p).sum()), float((y & ~p).sum()), zero_division)[2]


def jaccard_binary(y_true, y_pred, zero_division: float = 0.0) -> float:
  """|y & p| / |y | p| of the positive class."""
  y, p = np.asarray(y_true).astype(bool), np.asarray(y_pred).astype(bool)
  union = float((y | p).sum())
  return float((y & p).sum()) / union if union > 0 else zero_division


def f1_multiclass(y_true, y_pred, average: str = "macro", labels=None, zero_division: float = 0.0) -> float:
  """Macro / weighted F1 over `labels` (default: the union of true and predicted labels, as sklearn)."""
  y, p = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
  labels = np.union1d(y, p) if labels is None else np.asarray(labels)
  f1s, support = [], []
  for c in labels:
    tp = float(((y == c) & (p == c)).sum())
    fp = float(((y != c) & (p == c)).sum())
    fn = float(((y == c) & (p != c)).sum())
    f1s.append(_prf(tp, fp, fn, zero_division)[2])
    support.append(float((y == c).sum()))
  f1s, support = np.asarray(f1s), np.asarray(support)
  if average == "macro":
    return float(f1s.mean())
  if average == "weighted":
    return float((f1s * support).sum() / support.sum()) if support.sum() > 0 else 0.0
  raise ValueError(f"f1_multiclass: average must be 'macro' or 'weighted', got '{average}'.")


def cohen_kappa(y_true, y_pred) -> float:
  """Cohen's kappa (unweighted)."""
  y, p = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
  labels = np.union1d(y, p)
  idx = {c: i for i, c in enumerate(labels)}
  k = len(labels)
  cm = np.zeros((k, k), np.float64)
  for a, b in zip(y, p):
    cm[idx[a], idx[b]] += 1
  n = cm.sum()
  po = np.trace(cm) / n
  pe = (cm.sum(0) * cm.sum(1)).sum() / n ** 2
  return float((po - pe) / (1 - pe)) if pe != 1 else float("nan")


def binary_metrics(y_true: np.ndarray, y_prob: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
  """Mortality / readmission metrics.

  Args:
    y_true: [n] {0, 1}.
    y_prob: [n] probabilities.
    threshold: decision threshold for F1 / Jaccard / accuracy.

  Returns:
    dict(auroc, auprc, f1, f1_macro, jaccard, accuracy).
  """
  where = "graphcare.binary_metrics"
  checks.labels_in(where, "y_true", checks.host_array(where, "y_true", y_true), (0, 1))
  checks.probabilities(where, "y_prob", checks.host_array(where, "y_prob", y_prob, np.float64))
  y = np.asarray(y_true).astype(int).ravel()
  p = np.asarray(y_prob, np.float64).ravel()
  pred = (p >= threshold).astype(int)
  return {"auroc": roc_auc(y, p), "auprc": average_precision(y, p), "f1": f1_binary(y, pred),
          "f1_macro": f1_multiclass(y, pred, "macro", labels=[0, 1]), "jaccard": jaccard_binary(y, pred),
          "accuracy": float((y == pred).mean())}


def multiclass_metrics(y_true: np.ndarray, y_prob: np.ndarray) -> dict[str, float]:
  """Length-of-stay metrics.

  Args:
    y_true: [n] int classes.
    y_prob: [n, K] class probabilities.

  Returns:
    dict(accuracy, f1_macro, f1_weighted, kappa, auroc) - auroc is one-vs-rest weighted by support over
    the classes present in y_true (NaN with fewer than two).
  """
  y = np.asarray(y_true).astype(int).ravel()
  prob = np.asarray(y_prob, np.float64)
  pred = prob.argmax(-1)
  present = np.unique(y)
  aucs, w = [], []
  for c in present:
    a = roc_auc(y == c, prob[:, c])
    if np.isfinite(a):
      aucs.append(a), w.append((y == c).sum())
  auroc = float(np.average(aucs, weights=w)) if len(present) > 1 and aucs else float("nan")
  return {"accuracy": float((y == pred).mean()), "f1_macro": f1_multiclass(y, pred, "macro"),
          "f1_weighted": f1_multiclass(y, pred, "weighted"), "kappa": cohen_kappa(y, pred), "auroc": auroc}


def multilabel_metrics(y_true: np.ndarray, y_prob: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
  """Drug-recommendation metrics, averaged over samples (rows).

  Args:
    y_true: [n, L] {0, 1}.
    y_prob: [n, L] probabilities.
    threshold: decision threshold.

  Returns:
    dict(jaccard, f1, auprc, auroc): Jaccard and F1 with zero_division=1 (official); AUPRC over rows with a
    positive label (sklearn gives 0 to rows without one, which we drop); AUROC over rows with both classes.
  """
  y = np.asarray(y_true).astype(bool)
  prob = np.asarray(y_prob, np.float64)
  pred = prob >= threshold
  jac, f1, ap, auc = [], [], [], []
  for yt, pp, pr in zip(y, pred, prob):
    jac.append(jaccard_binary(yt, pp, zero_division=1.0))
    f1.append(f1_binary(yt, pp, zero_division=1.0))
    if yt.any():
      ap.append(average_precision(yt, pr))
    if yt.any() and (~yt).any():
      auc.append(roc_auc(yt, pr))
  mean = lambda v: float(np.mean(v)) if v else float("nan")
  return {"jaccard": mean(jac), "f1": mean(f1), "auprc": mean(ap), "auroc": mean(auc)}


def task_metrics(task: str, y_true: np.ndarray, y_prob: np.ndarray) -> dict[str, float]:
  """Dispatches to the metrics of `task` ('binary' | 'multiclass' | 'multilabel')."""
  if task == "binary":
    return binary_metrics(y_true, y_prob)
  if task == "multiclass":
    return multiclass_metrics(y_true, y_prob)
  if task == "multilabel":
    return multilabel_metrics(y_true, y_prob)
  raise ValueError(f"unknown task '{task}'; choose one of {TASKS}.")


PRIMARY = {"binary": "auroc", "multiclass": "kappa", "multilabel": "jaccard"}


def bootstrap_ci(task: str, y_true: np.ndarray, y_prob: np.ndarray, num_resamples: int = 1000, level: float = 0.95,
                 seed: int = 0, metrics: tuple[str, ...] | None = None) -> dict[str, tuple[float, float]]:
  """Percentile bootstrap intervals of the task metrics (resampling samples with replacement).

  Args:
    task: 'binary' | 'multiclass' | 'multilabel'.
    y_true, y_prob: as in `task_metrics`.
    num_resamples: bootstrap draws.
    level: interval coverage.
    seed: RNG seed.
    metrics: which metric names (default all).

  Returns:
    {metric: (low, high)}; NaN draws (e.g. one class only) are ignored, and an all-NaN metric gives (nan, nan).
  """
  where = "graphcare.bootstrap_ci"
  checks.in_range(where, "level", level, 0.0, 1.0, low_open=True, high_open=True)
  checks.static_int(where, "num_resamples", num_resamples, low=1)
  y_true, y_prob = checks.host_array(where, "y_true", y_true), checks.host_array(where, "y_prob", y_prob)
  n = len(y_true)
  checks.nonempty(where, "y_true", n, "samples")
  rng = np.random.default_rng(seed)
  draws: dict[str, list[float]] = {}
  for _ in range(num_resamples):
    idx = rng.integers(0, n, n)
    for k, v in task_metrics(task, y_true[idx], y_prob[idx]).items():
      if metrics is None or k in metrics:
        draws.setdefault(k, []).append(v)
  lo_q, hi_q = 100 * (1 - level) / 2, 100 * (1 + level) / 2
  out = {}
  for k, v in draws.items():
    v = np.asarray(v, np.float64)
    v = v[np.isfinite(v)]
    out[k] = (float(np.percentile(v, lo_q)), float(np.percentile(v, hi_q))) if len(v) else (float("nan"), float("nan"))
  return out


def paired_bootstrap_delta(metric_fn: Callable[[np.ndarray, np.ndarray], float], y_true, prob_a, prob_b,
                           num_resamples: int = 1000, seed: int = 0) -> tuple[float, float, float]:
  """Bootstrap of metric(a) - metric(b) on the same resampled rows -> (delta, low 2.5%, high 97.5%)."""
  y_true, prob_a, prob_b = np.asarray(y_true), np.asarray(prob_a), np.asarray(prob_b)
  rng = np.random.default_rng(seed)
  n = len(y_true)
  d = []
  for _ in range(num_resamples):
    idx = rng.integers(0, n, n)
    v = metric_fn(y_true[idx], prob_a[idx]) - metric_fn(y_true[idx], prob_b[idx])
    if np.isfinite(v):
      d.append(v)
  full = metric_fn(y_true, prob_a) - metric_fn(y_true, prob_b)
  if not d:
    return float(full), float("nan"), float("nan")
  return float(full), float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))
