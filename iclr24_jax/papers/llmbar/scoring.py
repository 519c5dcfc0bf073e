"""Meta-evaluation metrics: accuracy over both presentation orders and positional agreement."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from iclr24_jax.papers.llmbar import data as data_lib


def _as_int_vector(x, name: str) -> np.ndarray:
  a = np.asarray(x)
  if a.ndim != 1:
    raise ValueError(f"{name} must be a 1-D sequence [N], got shape {a.shape}.")
  if a.size and not np.issubdtype(a.dtype, np.integer):
    if not np.all(np.equal(np.mod(a, 1), 0)):
      raise ValueError(f"{name} must hold integers, got {a[:5]}...")
  return a.astype(np.int64)


def score(labels: Sequence[int], winners_original: Sequence[int], winners_swapped: Sequence[int],
          count_failures_as_agreement: bool = False) -> dict[str, float]:
  """Accuracy and positional agreement of an evaluator over N instances judged in both orders.

  Args:
    labels: [N] gold labels, 1 or 2.
    winners_original: [N] the evaluator's pick in the original order: 1, 2, or 0 for a failure/tie.
    winners_swapped: [N] its pick in the swapped order, already mapped back to output ids (1, 2 or 0).
    count_failures_as_agreement: False (ours): an instance agrees only when both orders pick the same output.
      True reproduces the official script, whose `equal` also counts two failures (None == None).

  Returns:
    accuracy = (correct original + correct swapped) / (2N); agreement = share of instances whose two orders
    pick the same output; also accuracy_original, accuracy_swapped, correct_both (share right in both orders),
    failure_rate (share of the 2N judgements that are 0) and n.
  """
  y = _as_int_vector(labels, "labels")
  w0 = _as_int_vector(winners_original, "winners_original")
  w1 = _as_int_vector(winners_swapped, "winners_swapped")
  if not (y.shape == w0.shape == w1.shape):
    raise ValueError(f"labels {y.shape}, winners_original {w0.shape} and winners_swapped {w1.shape} must have the "
                     "same length N.")
  if y.size == 0:
    raise ValueError("score needs at least one instance (N = 0).")
  if not np.all(np.isin(y, (1, 2))):
    raise ValueError(f"labels must be 1 or 2, got values {sorted(set(y.tolist()))}.")
  for name, w in (("winners_original", w0), ("winners_swapped", w1)):
    if not np.all(np.isin(w, (0, 1, 2))):
      raise ValueError(f"{name} must be 1, 2 or 0 (failure/tie), got values {sorted(set(w.tolist()))}.")
  c0 = w0 == y
  c1 = w1 == y
  same = w0 == w1
  if not count_failures_as_agreement:
    same &= w0 != 0
  n = y.size
  return {"accuracy": float((c0.sum() + c1.sum()) / (2 * n)), "agreement": float(same.mean()),
          "accuracy_original": float(c0.mean()), "accuracy_swapped": float(c1.mean()),
          "correct_both": float((c0 & c1).mean()), "failure_rate": float(((w0 == 0).sum() + (w1 == 0).sum()) / (2 * n)),
          "n": int(n)}


def score_subsets(per_subset: Mapping[str, Mapping[str, Sequence[int]]],
                  count_failures_as_agreement: bool = False) -> dict[str, dict[str, float]]:
  """Scores every subset and adds the paper's 'Adversarial' row (unweighted mean of the adversarial subsets).

  Args:
    per_subset: {subset: {'labels': [N], 'winners_original': [N], 'winners_swapped': [N]}}.
    count_failures_as_agreement: see `score`.

  Returns:
    {subset: score dict, ..., 'Adversarial': {'accuracy', 'agreement'} averaged over the adversarial subsets
    present (the paper averages the four subsets, not the 319 instances)}.
  """
  out = {name: score(r["labels"], r["winners_original"], r["winners_swapped"], count_failures_as_agreement)
         for name, r in per_subset.items()}
  adv = [out[k] for k in data_lib.ADVERSARIAL if k in out]
  if adv:
    out["Adversarial"] = {"accuracy": float(np.mean([r["accuracy"] for r in adv])),
                          "agreement": float(np.mean([r["agreement"] for r in adv])),
                          "n": int(sum(r["n"] for r in adv)), "subsets": len(adv)}
  return out
