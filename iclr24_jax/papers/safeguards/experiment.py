"""Experiments of the conceptual safeguards paper: coverage vs confirmation budget at a target accuracy.

run(config, workdir): trains calibrated concept detectors and the front end, picks the threshold on validation
for each of `config.safeguard.target_accuracies`, and traces test coverage as the confirmation budget grows, for the
variance-greedy and random policies, under the per-concept budget and the official global budget (the same total
number of confirmations in one greedy order over all pairs); baselines: no confirmation, no propagation (hard concepts), and a
selective classifier trained directly on x. Writes metrics.jsonl (detector training), results.json and
coverage_vs_budget.png.

Where things are: the training pipeline (detectors, calibration, front end, propagation, the selective baseline)
in `train.py`; the coverage-vs-budget evaluation in `evaluation.py`; the reproduction study and the benchmark
in `study.py`. This module keeps `run` and the coverage plot it writes (`plot_coverage`, also used by the study).
"""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.papers.safeguards import data as sg_data
from iclr24_jax.papers.safeguards.evaluation import evaluate_target
from iclr24_jax.papers.safeguards.train import build_safeguard, train_selective_baseline


def _concept_metrics(probs: np.ndarray, c: np.ndarray) -> dict[str, float]:
  p = np.clip(probs, 1e-7, 1 - 1e-7)
  bce = -np.mean(c * np.log(p) + (1 - c) * np.log(1 - p))
  # expected calibration error, 10 equal-width bins over all concepts
  bins = np.minimum((p * 10).astype(int), 9).ravel()
  ece = sum(abs(p.ravel()[bins == i].mean() - c.ravel()[bins == i].mean()) * np.mean(bins == i)
            for i in range(10) if np.any(bins == i))
  return {"concept_accuracy": float(np.mean((p > 0.5) == (c > 0.5))), "concept_bce": float(bce),
          "concept_ece": float(ece)}


def plot_coverage(curves: dict[str, dict], path: str) -> str:
  """Coverage vs confirmation budget, one panel per (data set, target accuracy).

  Args:
    curves: title -> a `coverage_curve` dict (optionally with 'global': the global-budget curve).
    path: PNG path.

  Returns:
    The path written.
  """
  n = len(curves)
  ncols = min(n, 2)
  fig, axes = metrics_lib.new_figure(ncols=ncols, nrows=-(-n // ncols), size=(4.8, 3.6))
  for ax in axes.flat[n:]:
    ax.axis("off")
  for ax, (title, cv) in zip(axes.flat, curves.items()):
    xs = 100 * np.asarray(cv["budget_fraction"])
    ax.plot(xs, cv["variance"]["coverage"], "o-", label="variance-greedy confirmation")
    rc, rs = np.asarray(cv["random"]["coverage"]), np.asarray(cv["random"]["coverage_std"])
    if "global" in cv:
      ax.plot(xs, cv["global"]["variance"]["coverage"], "^--", color="C2",
              label="variance-greedy, global budget (official)")
    ax.plot(xs, rc, "s-", label="random confirmation (mean, +-1 sd)")
    ax.fill_between(xs, rc - rs, rc + rs, alpha=0.2, color="C1")
    ax.axhline(cv["variance"]["coverage"][0], color="gray", ls="--", label="no confirmation")
    if "no_propagation_coverage" in cv:
      ax.axhline(cv["no_propagation_coverage"], color="C3", ls=":", label="no propagation (hard concepts)")
    if "selective_x_coverage" in cv:
      ax.axhline(cv["selective_x_coverage"], color="k", ls="-.", label="selective classifier on x")
    ax.set_xlabel("budget per concept (% of abstained instances)")
    ax.set_ylabel("test coverage")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, 1.05)
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, bbox_to_anchor=(0.5, -0.06))
  fig.tight_layout()
  return metrics_lib.save_figure(fig, path)


def run(config: Any, workdir: str, progress: bool = True) -> dict:
  """Builds a safeguard on config.data and traces coverage vs confirmation budget; see module docstring.

  Returns:
    results (also in workdir/results.json): the first target accuracy's numbers at the top level (tau, curve,
    val_at_tau, test_at_tau, no_propagation, true_concepts_at_tau, selective_x) and every target under 'targets'.
  """
  if config.data.name in sg_data.DATASETS:   # the paper's own data: read first (DataNotFoundError
    sg_data.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("safeguards", config.data)   # run() does not train on it yet
  os.makedirs(workdir, exist_ok=True)
  ds = sg_data.load_concept_dataset(config.data)
  sc = config.safeguard
  targets = tuple(float(t) for t in sc.target_accuracies)
  if not targets or any(not 0.5 < t <= 1.0 for t in targets):
    raise ValueError(f"safeguard.target_accuracies {targets} must be non-empty values in (0.5, 1].")
  built = build_safeguard(config, ds, workdir, progress=progress)
  selective_x = None
  if config.baseline.get("enabled", True):
    selective_x = train_selective_baseline(config, ds, os.path.join(workdir, "selective_x"), progress=progress)
  per_target = {f"{t:g}": evaluate_target(config, ds, built, t, selective_x) for t in targets}
  main = per_target[f"{targets[0]:g}"]
  results = {
      "data": {"name": ds.name, "train": len(ds.train), "val": len(ds.val), "test": len(ds.test),
               "concepts": list(ds.concept_names)},
      "front_end": jax.device_get(built["front_end"]), "detector_eval": built["detector_eval"],
      "test_concepts": _concept_metrics(built["probs"]["test"], ds.test.c), "train_s": built["train_s"],
      **main, "targets": per_target,
  }
  if jax.process_index() == 0:
    results["plot"] = plot_coverage({f"{ds.name}, target accuracy {t}": {**r["curve"], "global": r["curve_global"]}
                                     for t, r in per_target.items()},
                            os.path.join(workdir, "coverage_vs_budget.png"))
  metrics_lib.write_results(workdir, results)
  return results
