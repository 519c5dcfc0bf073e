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


# -------------------------------------------- intervals (ours; the paper reports point accuracies without intervals)


def item_correctness(labels: Sequence[int], winners_original: Sequence[int],
                     winners_swapped: Sequence[int]) -> np.ndarray:
  """Per-pair credit behind `score`'s accuracy: (correct original + correct swapped) / 2 in {0, 0.5, 1}.

  Args:
    labels, winners_original, winners_swapped: [N] as in `score` (0 = failure/tie, wrong).

  Returns:
    [N] float; its mean is `score(...)['accuracy']`.
  """
  y = _as_int_vector(labels, "labels")
  w0 = _as_int_vector(winners_original, "winners_original")
  w1 = _as_int_vector(winners_swapped, "winners_swapped")
  if not (y.shape == w0.shape == w1.shape):
    raise ValueError(f"labels {y.shape}, winners {w0.shape} / {w1.shape} must have the same length N.")
  return 0.5 * ((w0 == y).astype(np.float64) + (w1 == y).astype(np.float64))


def first_position_rate(winners_original: Sequence[int], winners_swapped: Sequence[int]) -> float:
  """Share of the 2N judgements that picked the output shown as (a) (original pick 1, or a swapped pick
  mapped back to 2). 1.0 = the always-"(a)" judge, 0.5 = no positional preference on balance.

  Args:
    winners_original: [N] output ids picked in the original order (1, 2, or 0 for a failure).
    winners_swapped: [N] output ids picked in the swapped order, mapped back (1, 2 or 0).

  Returns:
    float in [0, 1] (failures count as not (a)).
  """
  w0 = _as_int_vector(winners_original, "winners_original")
  w1 = _as_int_vector(winners_swapped, "winners_swapped")
  if w0.shape != w1.shape:
    raise ValueError(f"winners_original has {w0.size} judgements but winners_swapped {w1.size}; pass both orders "
                     "of the same pairs.")
  return float((np.sum(w0 == 1) + np.sum(w1 == 2)) / (2 * max(w0.size, 1)))


def _boot_means(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
  idx = rng.integers(0, values.size, size=(n_boot, values.size))
  return values[idx].mean(axis=1)


def subset_bootstrap(per_subset: Mapping[str, np.ndarray], n_boot: int = 2000, seed: int = 0,
                     alpha: float = 0.05) -> dict[str, tuple[float, float]]:
  """Percentile bootstrap intervals of per-subset accuracy and of the paper's 'Adversarial' mean.

  Pairs are resampled within each subset; 'Adversarial' is the unweighted mean of the adversarial subsets'
  resampled accuracies (a stratified bootstrap of the paper's statistic).

  Args:
    per_subset: {subset: [N_s] per-pair credit (`item_correctness`)}.
    n_boot: resamples.
    seed: resampling seed.
    alpha: 1 - coverage.

  Returns:
    {subset: (lo, hi)} (fractions), plus 'Adversarial' when an adversarial subset is present.
  """
  rng = np.random.default_rng(seed)
  boots = {k: _boot_means(np.asarray(v, np.float64), n_boot, rng) for k, v in per_subset.items() if len(v)}
  adv = [boots[k] for k in data_lib.ADVERSARIAL if k in boots]
  if adv:
    boots["Adversarial"] = np.mean(adv, axis=0)
  q = [alpha / 2, 1 - alpha / 2]
  return {k: tuple(float(x) for x in np.quantile(b, q)) for k, b in boots.items()}


def _group_names(per_subset: Mapping[str, np.ndarray], group: str) -> list[str]:
  names = list(data_lib.ADVERSARIAL) if group == "Adversarial" else [group]
  return [k for k in names if k in per_subset and len(per_subset[k])]


def bootstrap_gap(a: Mapping[str, np.ndarray], group_a: str, b: Mapping[str, np.ndarray], group_b: str, *,
                  paired: bool, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05,
                  direction: str = "greater") -> dict:
  """Bootstrap interval of accuracy(a on group_a) - accuracy(b on group_b) and the verdict it supports.

  A group is one subset or 'Adversarial' (the unweighted mean of the adversarial subsets). Pairs are
  resampled within each subset; `paired=True` (same subsets, same pairs, e.g. two strategies) resamples
  the same pairs for both arms.

  Args:
    a, b: {subset: [N_s] per-pair credit}.
    group_a, group_b: subset names or 'Adversarial'.
    paired: resample pairs jointly (requires the same subsets and sizes).
    n_boot, seed, alpha: bootstrap settings.
    direction: 'greater' (claim a > b) or 'less'.

  Returns:
    dict(diff, lo, hi, holds) with holds 'yes' (interval beyond 0 in the claimed direction), 'no' (beyond 0
    against it) or 'inconclusive' (the interval contains 0); fractions.
  """
  if direction not in ("greater", "less"):
    raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}.")
  names_a = _group_names(a, group_a)
  names_b = _group_names(b, group_b)
  if not names_a or not names_b:
    raise ValueError(f"no pairs for {group_a!r} in a or {group_b!r} in b.")
  rng = np.random.default_rng(seed)
  boot_a, boot_b = [], []
  if paired:
    if names_a != names_b:
      raise ValueError("paired gaps need the same group in both arms.")
    for k in names_a:
      va, vb = np.asarray(a[k], np.float64), np.asarray(b[k], np.float64)
      if va.shape != vb.shape:
        raise ValueError(f"paired gaps need the same pairs: subset {k} has {va.size} and {vb.size}.")
      idx = rng.integers(0, va.size, size=(n_boot, va.size))
      boot_a.append(va[idx].mean(1))
      boot_b.append(vb[idx].mean(1))
  else:
    boot_a = [_boot_means(np.asarray(a[k], np.float64), n_boot, rng) for k in names_a]
    boot_b = [_boot_means(np.asarray(b[k], np.float64), n_boot, rng) for k in names_b]
  diffs = np.mean(boot_a, axis=0) - np.mean(boot_b, axis=0)
  point = (np.mean([np.mean(a[k]) for k in names_a]) - np.mean([np.mean(b[k]) for k in names_b]))
  lo, hi = (float(x) for x in np.quantile(diffs, [alpha / 2, 1 - alpha / 2]))
  signed_lo, signed_hi = (lo, hi) if direction == "greater" else (-hi, -lo)
  holds = "yes" if signed_lo > 0 else ("no" if signed_hi < 0 else "inconclusive")
  return {"diff": float(point), "lo": lo, "hi": hi, "holds": holds, "n_a": sum(len(a[k]) for k in names_a),
          "n_b": sum(len(b[k]) for k in names_b), "paired": bool(paired)}


def subset_report(per_subset: Mapping[str, Mapping[str, Sequence[int]]], count_failures_as_agreement: bool = False,
                  n_boot: int = 2000, seed: int = 0) -> dict[str, dict]:
  """`score_subsets` plus, per subset, the bootstrap 95% interval on accuracy, the raw (non-debiased) picks'
  accuracy / agreement and the first-position rate.

  Args:
    per_subset: {subset: {'labels', 'winners_original', 'winners_swapped'[, 'raw_original', 'raw_swapped']}};
      the raw picks default to the winners (generate mode, where the answers are the raw picks).
    count_failures_as_agreement: see `score`.
    n_boot, seed: bootstrap settings.

  Returns:
    {subset: score dict + 'ci' (lo, hi), 'raw_accuracy', 'raw_agreement', 'position_a_rate'} and 'Adversarial'
    (means over the adversarial subsets; its 'ci' from the stratified bootstrap).
  """
  out = score_subsets({k: {f: v[f] for f in ("labels", "winners_original", "winners_swapped")}
                       for k, v in per_subset.items()}, count_failures_as_agreement)
  credit = {k: item_correctness(v["labels"], v["winners_original"], v["winners_swapped"])
            for k, v in per_subset.items()}
  cis = subset_bootstrap(credit, n_boot, seed)
  for k, v in per_subset.items():
    r0, r1 = v.get("raw_original", v["winners_original"]), v.get("raw_swapped", v["winners_swapped"])
    raw = score(v["labels"], r0, r1, count_failures_as_agreement)
    out[k].update(ci=cis[k], raw_accuracy=raw["accuracy"], raw_agreement=raw["agreement"],
                  position_a_rate=first_position_rate(r0, r1))
  if "Adversarial" in out:
    adv = [out[k] for k in data_lib.ADVERSARIAL if k in per_subset]
    out["Adversarial"].update(ci=cis["Adversarial"], **{f: float(np.mean([r[f] for r in adv])) for f in
                                                        ("raw_accuracy", "raw_agreement", "position_a_rate")})
  return out
