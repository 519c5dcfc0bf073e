"""Judging claims on seeds: mean +- standard error, paired differences, bootstrap intervals.

The reproduction rule of the library: a claim that compares methods is judged on several seeds (paired by seed
where the methods share data). It *holds* ('yes') when the mean difference is beyond `z` standard errors in the
claimed direction, fails ('no') when it is beyond `z` standard errors against it, and is 'inconclusive' otherwise.
A difference inside the seed noise is neither a yes nor a no.

  a = [0.71, 0.73, 0.70]; b = [0.65, 0.69, 0.66]      # one value per seed, same seeds
  judge(a, b, paired=True, direction='greater')['holds']   # -> 'yes' when mean(a - b) > 2 SE(a - b)

Every paper's `reproduce()` builds its comparison rows with `compare_row` (or `judge` + its own row). Each row has
a `kind` (`KINDS`): a *claim* tests a statement the paper makes (its `basis` quotes the paper's words and says
where they stand), a *check* verifies the implementation or a setting whose outcome its construction fixes, and a
*measurement* is a number without a verdict. `experiments/reproduce.py` counts claims (yes / no / inconclusive /
not run) apart from checks (pass / fail / inconclusive) and measurements, and refuses a row without a valid kind
(`row_kind`). A headline claim nobody has run yet is a `not_run_row` in the study's `NOT_RUN` list.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

HOLDS = ("yes", "no", "inconclusive")
NOT_RUN = "not run"   # the `holds` of a claim row that no run has tested yet (see `not_run_row`)
# claim: tests a statement the paper makes; check: verifies the implementation, or a setting whose outcome is fixed
# by its construction; measurement: a number without a verdict.
KINDS = ("claim", "check", "measurement")


class RowKindError(ValueError):
  """A reproduction row whose `kind` is missing or does not fit its verdict (see `row_kind`)."""


def _as_1d(x: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
  arr = np.asarray(x, dtype=np.float64).reshape(-1)
  if arr.size == 0:
    raise ValueError(f"{name} is empty: pass one value per seed (or per item).")
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} contains NaN or inf ({arr.tolist()}): fix the run that produced it before judging.")
  return arr


def mean_se(x: Sequence[float] | np.ndarray) -> tuple[float, float]:
  """Mean and standard error of the mean (sample std with ddof=1 over sqrt(n); 0 for a single value).

  Args:
    x: [N] values, one per seed.

  Returns:
    (mean, se) as floats.
  """
  arr = _as_1d(x, "x")
  if arr.size == 1:
    return float(arr[0]), 0.0
  return float(arr.mean()), float(arr.std(ddof=1) / math.sqrt(arr.size))


def verdict(diff: float, se: float, direction: str = "greater", z: float = 2.0) -> str:
  """'yes' / 'no' / 'inconclusive' for a difference and its standard error.

  Args:
    diff: the estimated difference a - b.
    se: its standard error (0 with a single seed: then the verdict is 'inconclusive' unless diff is exactly
      in a direction AND se is 0 because every seed agrees exactly, see `judge`).
    direction: 'greater' if the claim is a > b, 'less' if the claim is a < b.
    z: how many standard errors count as beyond the noise (2 ~ a 95% interval).
  """
  if direction not in ("greater", "less"):
    raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}.")
  signed = diff if direction == "greater" else -diff
  if se <= 0.0:
    return "inconclusive" if signed == 0.0 else ("yes" if signed > 0 else "no")
  if signed > z * se:
    return "yes"
  if signed < -z * se:
    return "no"
  return "inconclusive"


def judge(a: Sequence[float], b: Sequence[float] | float, *, paired: bool = True, direction: str = "greater",
          z: float = 2.0, min_seeds: int = 3) -> dict[str, Any]:
  """Judges the claim "a > b" (or "a < b") from per-seed values.

  Args:
    a: [N] per-seed values of the first arm (the method the paper claims is better).
    b: [N] (or [M] when unpaired) per-seed values of the second arm, or a float (a fixed reference value).
    paired: pair a[i] with b[i] (same seed, same data): the SE is that of the per-seed differences.
    direction: 'greater' (claim a > b) or 'less' (claim a < b).
    z: number of standard errors a difference must exceed.
    min_seeds: fewer seeds than this give 'inconclusive' whatever the values (a single run is not evidence).

  Returns:
    dict(holds, mean_a, se_a, mean_b, se_b, diff, se_diff, n, paired).
  """
  a_arr = _as_1d(a, "a")
  if np.isscalar(b):
    b_arr = np.full_like(a_arr, float(b))
    paired = True
  else:
    b_arr = _as_1d(b, "b")
  if paired and a_arr.shape != b_arr.shape:
    raise ValueError(f"paired judging needs one value per seed in both arms; got {a_arr.size} and {b_arr.size}. "
                     "Pass paired=False for independent samples.")
  mean_a, se_a = mean_se(a_arr)
  mean_b, se_b = mean_se(b_arr)
  if paired:
    diff, se_diff = mean_se(a_arr - b_arr)
  else:
    diff, se_diff = mean_a - mean_b, math.sqrt(se_a ** 2 + se_b ** 2)
  n = int(min(a_arr.size, b_arr.size))
  holds = verdict(diff, se_diff, direction, z) if n >= min_seeds else "inconclusive"
  return dict(holds=holds, mean_a=mean_a, se_a=se_a, mean_b=mean_b, se_b=se_b, diff=diff, se_diff=se_diff, n=n,
              paired=bool(paired))


def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, alpha: float = 0.05, seed: int = 0,
                 stat: Callable[[np.ndarray], float] = np.mean) -> tuple[float, float]:
  """Percentile bootstrap interval of a statistic over items (e.g. per-item correctness).

  Args:
    values: [N] per-item values.
    n_boot: bootstrap resamples.
    alpha: 1 - coverage (0.05 -> a 95% interval).
    seed: resampling seed.
    stat: the statistic (applied along the last axis of an [n_boot, N] array when it accepts `axis`).

  Returns:
    (lo, hi).
  """
  arr = _as_1d(values, "values")
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
  samples = arr[idx]
  try:
    stats = np.asarray(stat(samples, axis=1))
  except TypeError:
    stats = np.array([stat(s) for s in samples])
  lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
  return float(lo), float(hi)


def bootstrap_diff(a: Sequence[float], b: Sequence[float], *, paired: bool = True, direction: str = "greater",
                   n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
  """Bootstrap interval of mean(a) - mean(b) over items, and the verdict it supports.

  The claim holds ('yes') when the whole interval lies on the claimed side of 0, fails ('no') when it lies on
  the other side, and is 'inconclusive' when it contains 0.

  Args:
    a: [N] per-item values of the first arm (e.g. 0/1 correctness of method A on each test item).
    b: [N] per-item values of the second arm (the same items when paired) or [M] when unpaired.
    paired: resample items jointly (same item in both arms).
    direction: 'greater' (claim a > b) or 'less'.
    n_boot, alpha, seed: as in `bootstrap_ci`.

  Returns:
    dict(diff, lo, hi, holds, mean_a, mean_b, n).
  """
  a_arr, b_arr = _as_1d(a, "a"), _as_1d(b, "b")
  rng = np.random.default_rng(seed)
  if paired:
    if a_arr.shape != b_arr.shape:
      raise ValueError(f"paired bootstrap needs the same items in both arms; got {a_arr.size} and {b_arr.size}.")
    idx = rng.integers(0, a_arr.size, size=(n_boot, a_arr.size))
    diffs = a_arr[idx].mean(1) - b_arr[idx].mean(1)
  else:
    ia = rng.integers(0, a_arr.size, size=(n_boot, a_arr.size))
    ib = rng.integers(0, b_arr.size, size=(n_boot, b_arr.size))
    diffs = a_arr[ia].mean(1) - b_arr[ib].mean(1)
  lo, hi = (float(v) for v in np.quantile(diffs, [alpha / 2, 1 - alpha / 2]))
  if direction not in ("greater", "less"):
    raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}.")
  if direction == "greater":
    holds = "yes" if lo > 0 else ("no" if hi < 0 else "inconclusive")
  else:
    holds = "yes" if hi < 0 else ("no" if lo > 0 else "inconclusive")
  return dict(diff=float(a_arr.mean() - b_arr.mean()), lo=lo, hi=hi, holds=holds, mean_a=float(a_arr.mean()),
              mean_b=float(b_arr.mean()), n=int(a_arr.size))


def fmt_mean_se(mean: float, se: float, digits: int = 3) -> str:
  """'0.712+-0.010' with `digits` significant digits.

  Args:
    mean: the mean, printed with `digits` significant digits (format 'g').
    se: its standard error, printed with 2 significant digits.
    digits: significant digits of the mean.

  Returns:
    the string '<mean>+-<se>'.
  """
  return f"{mean:.{digits}g}+-{se:.2g}"


def compare_row(*, paper: str, experiment: str, metric: str, a: Sequence[float], b: Sequence[float] | float,
                name_a: str, name_b: str, paper_value: str | None = None, direction: str = "greater",
                paired: bool = True, notes: str = "", z: float = 2.0, kind: str | None = None, basis: str = "",
                **extra: Any) -> dict[str, Any]:
  """A reproduction row for "name_a beats name_b on metric", judged with `judge`.

  Args:
    paper, experiment, metric: the row's labels.
    a, b: [N] per-seed values of each arm (b may be a float reference).
    name_a, name_b: arm names shown in the row.
    paper_value: the paper's number or claim.
    direction: 'greater' if larger metric is the claim for a (accuracy), 'less' if smaller (error).
    paired: the arms share seeds and data.
    notes: free text appended to the interval summary.
    z: standard errors for the verdict.
    kind: 'claim', 'check' or 'measurement' (`KINDS`). A measurement carries no verdict (holds None; `judgement`
      keeps the numbers). Left None, the row has no kind and `experiments/reproduce.py` refuses to table it.
    basis: for a claim, the paper's words it tests and where they stand ("'...' (Sec. 4, Table 2)"); for a check
      or a measurement that reads like a claim, why it is not one.
    **extra: more columns (plots=[...], ...).

  Returns:
    A row dict: paper, experiment, metric, ours (formatted), paper_value, holds ('yes'|'no'|'inconclusive', None for
    a measurement), notes, kind and basis (when given), and `judgement` (the raw numbers of `judge`, including the
    per-seed values).

  Raises:
    RowKindError: `kind` is not one of `KINDS`.
  """
  if kind is not None and kind not in KINDS:
    raise RowKindError(f"kind must be one of {KINDS} (or None), got {kind!r}.")
  res = judge(a, b, paired=paired, direction=direction, z=z)
  ours = (f"{name_a} {fmt_mean_se(res['mean_a'], res['se_a'])} vs {name_b} {fmt_mean_se(res['mean_b'], res['se_b'])}; "
          f"diff {res['diff']:+.3g}+-{res['se_diff']:.2g} ({res['n']} seeds"
          f"{', vs a fixed value' if np.isscalar(b) else (', paired' if res['paired'] else '')})")
  judgement = dict(res, a=[float(v) for v in np.ravel(a)],
                   b=float(b) if np.isscalar(b) else [float(v) for v in np.ravel(b)], direction=direction, z=z)
  row = dict(paper=paper, experiment=experiment, metric=metric, ours=ours, paper_value=paper_value,
             holds=None if kind == "measurement" else res["holds"], notes=notes, judgement=judgement)
  if kind is not None:
    row["kind"] = kind
  if basis:
    row["basis"] = basis
  row.update(extra)
  return row


def not_run_row(*, paper: str, basis: str, reason: str, variant: str, experiment: str = "headline claim (abstract)",
                metric: str = "-", paper_value: str | None = None) -> dict[str, Any]:
  """A claim row for a headline claim that no run tests yet, so that the gap shows in the report.

  Args:
    paper: the paper's slug.
    basis: the paper's words and where they stand ("'...' (abstract)").
    reason: why it is not run (data, compute, a missing arm).
    variant: what would run it: a config variant (`configs/<slug>.py:<arg>`) or the arm to add.
    experiment, metric: the row's labels.
    paper_value: the paper's number, if it gives one.

  Returns:
    A row dict with kind 'claim', holds 'not run', basis, variant and notes that say why.
  """
  if not (basis and reason and variant):
    raise RowKindError(f"a not-run row of {paper!r} needs a basis (the paper's words), a reason and a variant "
                       f"(what would run it); got basis={basis!r}, reason={reason!r}, variant={variant!r}.")
  return dict(paper=paper, experiment=experiment, metric=metric, ours="-",
              paper_value=paper_value if paper_value is not None else "-", holds=NOT_RUN, kind="claim",
              basis=basis, variant=variant, notes=f"not run: {reason}; would run with {variant}")


def miniature_rows(rows: list[dict[str, Any]], label: str, seeds_rows: str) -> list[dict[str, Any]]:
  """The rows of a main-job miniature whose claims and checks a run-by-name study judges with seeds.

  A miniature (one seed of a study too heavy for the main job) repeats the study's rows; counting its verdicts as
  well would count each claim twice, once on a budget that cannot resolve it. So its claims and checks become
  measurements: the verdict at this budget stays readable in the notes, the count goes to the seeded study's rows.

  Args:
    rows: the miniature's rows (as the study built them).
    label: what the miniature is ("1 seed, no top-k arms").
    seeds_rows: where the judged rows are and how to rerun them ("results/rows/x_seeds.json, --only x_seeds").

  Returns:
    New row dicts: kind 'measurement', holds None, notes opening with the miniature's label, the pointer and the
    verdict it had ("verdict at this budget: inconclusive").
  """
  out = []
  for r in rows:
    r = dict(r)
    kind, holds = r.get("kind"), normalise_holds(r.get("holds"))
    note = f"Miniature of the main job ({label}): {seeds_rows}."
    if kind in ("claim", "check") and holds in HOLDS:   # a 'not run' claim stays: it marks a gap, not a verdict
      note += f" As a {kind} at this budget: {holds} (not counted; the seeded study's row is)."
      r["kind"], r["holds"] = "measurement", None
    r["notes"] = f"{note} {r.get('notes') or ''}".rstrip()
    out.append(r)
  return out


def row_kind(row: dict[str, Any], where: str = "", require_verdict: bool = True) -> str:
  """The row's kind after checking that it fits the row's verdict.

  A claim needs a basis and a verdict ('yes' / 'no' / 'inconclusive', or 'not run' with the variant that would
  run it); a check needs a verdict; a measurement has none (holds None or '-').

  Args:
    row: a reproduction row.
    where: how to name the row in an error ("experiment 'cpm', row 3 (...)").
    require_verdict: False accepts a claim or check without a verdict (a smoke run's rows, judged on nothing).

  Returns:
    'claim', 'check' or 'measurement'.

  Raises:
    RowKindError: the kind is missing or unknown, or does not fit the row's holds / basis.
  """
  where = where or f"row {row.get('experiment')!r} / {row.get('metric')!r}"
  kind = row.get("kind")
  if kind not in KINDS:
    what = "has no 'kind'" if kind is None else f"has kind {kind!r}"
    raise RowKindError(
        f"{where} {what}: give every row kind='claim' (tests a statement the paper makes), 'check' (verifies the "
        "implementation, or a setting whose outcome its construction fixes) or 'measurement' (a number without a "
        "verdict) where the row is built (stats.compare_row(kind=...) or the row dict).")
  try:
    holds = normalise_holds(row.get("holds"))
  except ValueError as e:
    raise RowKindError(f"{where}: {e}") from None
  unjudged_ok = holds is None and not require_verdict
  if kind == "measurement" and holds is not None:
    raise RowKindError(f"{where} is a measurement but has holds={row.get('holds')!r}: a measurement carries no "
                       "verdict (holds None); make it a 'claim' or a 'check' if the verdict is meant.")
  if kind == "check" and holds not in HOLDS and not unjudged_ok:
    raise RowKindError(f"{where} is a check but has holds={row.get('holds')!r}: a check is judged 'yes' (pass), "
                       "'no' (fail) or 'inconclusive'.")
  if kind == "claim":
    if holds is None and not unjudged_ok:
      raise RowKindError(f"{where} is a claim without a verdict: judge it ('yes' / 'no' / 'inconclusive'), mark it "
                         "'not run' (stats.not_run_row), or make it a 'measurement'.")
    if not str(row.get("basis") or "").strip():
      raise RowKindError(f"{where} is a claim without a basis: say which paper sentence or table it tests, "
                         "quoting a few words (basis=\"'...' (Sec. 4, Table 2)\").")
    if holds == NOT_RUN and not str(row.get("variant") or "").strip():
      raise RowKindError(f"{where} is 'not run' without a variant: name the config variant or arm that would run it.")
  return kind


def normalise_holds(value: Any) -> str | None:
  """Maps a row's `holds` to 'yes' / 'no' / 'inconclusive' / 'not run' / None (a measurement without a claim).

  Legacy rows use True / False; strings 'yes'/'no'/'inconclusive'/'not run' (any case) pass through; None, '-'
  and '' mean no claim.

  Args:
    value: the row's `holds`.

  Returns:
    'yes', 'no', 'inconclusive', 'not run' or None.

  Raises:
    ValueError: an unknown value.
  """
  if value is None:
    return None
  if isinstance(value, bool):
    return "yes" if value else "no"
  s = str(value).strip().lower()
  if s in ("", "-", "none"):
    return None
  if s in ("true", "yes"):
    return "yes"
  if s in ("false", "no"):
    return "no"
  if s.startswith("inconclusive"):
    return "inconclusive"
  if s == NOT_RUN:
    return NOT_RUN
  raise ValueError(f"unknown holds value {value!r}: use 'yes', 'no', 'inconclusive', 'not run' or None.")
