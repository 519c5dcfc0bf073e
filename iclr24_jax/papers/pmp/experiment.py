"""PMP experiment: `run` (one config: train the model and its baselines, write results and plots).

The reproduction (PMP vs GraphSAGE vs GCN on the synthetic fraud graph and the geom_gcn graphs) and the benchmark
(full-graph train step/s vs number of edges) are in `study.py`."""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.papers.pmp import data as data_lib
from iclr24_jax.papers.pmp import train as train_lib

PAPER_AUC = {"yelpchi": 0.9397, "amazon": 0.9757, "tfinance": 0.9710}
MODEL_NAMES = {"pmp": "PMP", "sage": "GraphSAGE", "gcn": "GCN"}
FRAUD_ENV = "PMP_FRAUD_DATA"


def load_graph(data_config: Any, seed: int = 0) -> data_lib.GraphData:
  """The GraphData a config names: the synthetic generator (seeded by `seed`), a user's .mat file, or geom_gcn.

  Args:
    data_config: config.data.
    seed: the run seed (generator seed for 'synthetic'; added to split_seed for geom_gcn).
  """
  name = data_config.name
  if name == "synthetic":
    return data_lib.make_fraud_graph(
        num_nodes=data_config.num_nodes, fraud_ratio=data_config.fraud_ratio, num_relations=data_config.num_relations,
        avg_degree=tuple(data_config.avg_degree), fraud_homophily=tuple(data_config.fraud_homophily),
        benign_fraud_rate=tuple(data_config.benign_fraud_rate), feature_dim=data_config.feature_dim,
        class_shift=data_config.class_shift, feature_noise=data_config.feature_noise,
        fraud_degree_factor=data_config.fraud_degree_factor, train_size=data_config.train_size,
        val_size=data_config.val_size, seed=seed)
  if name in data_lib.FRAUD_FILES:   # the paper's .mat files (DataNotFoundError naming the source when absent)
    return data_lib.load(data_config)
  if name in data_lib.GEOM_GCN:
    root = data_config.get("data_dir") or None
    return data_lib.load_geom_gcn(name, root=root, train_size=data_config.train_size,
                                  val_size=data_config.val_size, seed=int(data_config.get("split_seed", 0)) + seed)
  raise ValueError(f"unknown data.name '{name}'; choose 'synthetic', {sorted(data_lib.FRAUD_FILES)} or "
                   f"{list(data_lib.GEOM_GCN)}.")


def curve_plot(histories: dict[str, list[dict]], key: str, path: str, title: str) -> str:
  fig, axes = metrics_lib.new_figure(size=(5.0, 3.5))
  ax = axes[0, 0]
  for name, rows in histories.items():
    pts = [(r["step"], r[key]) for r in rows if key in r]
    if pts:
      xs, ys = zip(*pts)
      ax.plot(xs, ys, label=MODEL_NAMES.get(name, name))
  ax.set_xlabel("step")
  ax.set_ylabel(key)
  ax.set_title(title)
  ax.legend()
  return metrics_lib.save_figure(fig, path)


def _score_hist(probs: np.ndarray, labels: np.ndarray, idx: np.ndarray, threshold: float, path: str, title: str) -> str:
  fig, axes = metrics_lib.new_figure(size=(5.0, 3.5))
  ax = axes[0, 0]
  p, y = probs[idx, 1], labels[idx]
  bins = np.linspace(0, 1, 41)
  ax.hist(p[y == 0], bins=bins, alpha=0.6, density=True, label="benign")
  ax.hist(p[y == 1], bins=bins, alpha=0.6, density=True, label="fraud")
  ax.axvline(threshold, color="k", ls="--", label=f"val threshold {threshold:.3f}")
  ax.set_xlabel("fraud probability (test nodes)")
  ax.set_title(title)
  ax.legend()
  return metrics_lib.save_figure(fig, path)


def run(config: Any, workdir: str) -> dict:
  """Trains config.model (and config.baselines, the same way) on config.data; writes metrics.jsonl,
  checkpoints, results.json and plots (validation curves, test score histogram)."""
  data = load_graph(config.data, seed=int(config.seed))
  desc = data.describe()
  main = train_lib.fit(config, data, workdir=workdir, progress=True)
  fits = {main["model"]: main}
  for b in config.get("baselines", ()):
    fits[b] = train_lib.fit(config, data, workdir=os.path.join(workdir, "baselines", b), model_name=b,
                            progress=False)
  results = {"data": desc, "model": main["model"], "aggregation": config.model.aggregation,
             "test": main["test"], "val": main["val"], "threshold": main["threshold"], "best_step": main["best_step"],
             "steps_per_s": main["steps_per_s"], "num_steps": config.num_steps,
             "baselines": {k: {"test": v["test"], "val": v["val"], "threshold": v["threshold"],
                               "best_step": v["best_step"]} for k, v in fits.items() if k != main["model"]}}
  if data.name in PAPER_AUC:
    results["paper_test_auc"] = PAPER_AUC[data.name]
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0:
    key = "eval/val_" + config.get("monitor", "auc")
    curve_plot({k: v["history"] for k, v in fits.items()}, key, os.path.join(workdir, "val_curves.png"),
                f"{data.name}: validation {config.get('monitor', 'auc')}")
    if data.num_classes == 2:
      _score_hist(main["probs"], data.labels, data.test_idx, main["threshold"],
                  os.path.join(workdir, "test_scores.png"), f"{data.name}: {MODEL_NAMES[main['model']]} test scores")
  return results
