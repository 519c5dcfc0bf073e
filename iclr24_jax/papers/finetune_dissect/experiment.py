"""finetune_dissect experiment: `run` (the synthetic-grammar study of one config: pretrain, finetune with each
method, decompose the probe versions' log-likelihood change over steps and positions; write results and plots).

The reproduction (claims judged over seeds, the real-text probes) and the benchmark are in `study.py`."""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import loop
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.papers.finetune_dissect import finetune
from iclr24_jax.papers.finetune_dissect import data as fd_data

COMPONENTS = ("topic", "style", "factual")


def plot_curves(study: dict, path: str) -> str:
  """Components (mean over seeds, +- SE band) over finetuning steps, one panel per method.

  Args:
    study: `finetune.synthetic_study` output (steps [E]; per method topic / style / factual [S, E]).
    path: PNG file to write.

  Returns:
    The path written.
  """
  methods = list(study["methods"])
  fig, axes = metrics_lib.new_figure(ncols=len(methods), size=(4.0, 3.2))
  steps = study["steps"]
  for j, m in enumerate(methods):
    ax = axes[0, j]
    for k in COMPONENTS:
      v = study["methods"][m][k]
      mean, se = v.mean(0), v.std(0, ddof=1) / np.sqrt(v.shape[0]) if v.shape[0] > 1 else np.zeros(v.shape[1])
      ax.plot(steps, mean, label=k)
      ax.fill_between(steps, mean - se, mean + se, alpha=0.25)
    ax.set_title(m)
    ax.set_xlabel("finetuning step")
    if j == 0:
      ax.set_ylabel("nats / token")
      ax.legend()
  return metrics_lib.save_figure(fig, path)


def plot_positions(study: dict, path: str) -> str:
  """Components by token position after finetuning (mean over seeds), one panel per method.

  Args:
    study: `finetune.synthetic_study` output (per method by_position {component: [S, T]}).
    path: PNG file to write.

  Returns:
    The path written.
  """
  methods = list(study["methods"])
  fig, axes = metrics_lib.new_figure(ncols=len(methods), size=(4.0, 3.2))
  for j, m in enumerate(methods):
    ax = axes[0, j]
    for k in COMPONENTS:
      c = study["methods"][m]["by_position"][k].mean(0)
      ax.plot(np.arange(1, c.size), c[1:], marker=".", label=k)
    ax.set_title(f"{m}: by position")
    ax.set_xlabel("token position")
    if j == 0:
      ax.set_ylabel("contrast (nats)")
      ax.legend()
  return metrics_lib.save_figure(fig, path)


def summarise(study: dict) -> dict:
  """JSON-ready summary: per method, per component, the final value and half-time per seed, early shares.

  Args:
    study: `finetune.synthetic_study` output.

  Returns:
    dict(steps, pretrain_final_loss [S], base_fit {slot: [S]} (the bases on fresh documents), entropy (the
    grammar's, `grammar.general_entropy`), methods {method: components [S, E] as lists, `finetune.claims` values,
    first_loss / final_loss [S] (mean finetuning loss over the first / last eval_every steps), seconds}).
  """
  cl = finetune.claims(study)
  out = {"steps": study["steps"].tolist(), "pretrain_final_loss": study["pretrain_loss"][:, -1].tolist(),
         "base_fit": {k: np.asarray(v).tolist() for k, v in study["base_fit"].items()},
         "entropy": dict(study["entropy"]), "methods": {}}
  chunk = int(study["steps"][0])   # eval_every
  for m, comp in study["methods"].items():
    out["methods"][m] = {
        **{k: comp[k].tolist() for k in (*COMPONENTS, "total")},
        **{k: v.tolist() for k, v in cl[m].items()},
        # Means over the first / last `eval_every`-step chunk: one minibatch's loss is too noisy to compare.
        "first_loss": comp["loss"][:, :chunk].mean(1).tolist(),
        "final_loss": comp["loss"][:, -chunk:].mean(1).tolist(),
        "seconds": comp["seconds"]}
  return out


def run(config: Any, workdir: str) -> dict:
  """Runs the synthetic study of `config`; writes results.json, metrics.jsonl (components per eval step, mean over
  seeds) and the curve / position plots.

  Pretraining and each method's finetuning are resumable stages (`finetune.synthetic_study` with
  `common.loop.Stages`): `workdir/pretrain` and `workdir/finetune_<method>` hold their checkpoints (every
  `checkpoint_every` steps, every `checkpoint_every_secs` seconds, and on SIGTERM / SIGINT) and metrics.jsonl, so a
  killed run started again resumes inside the stage it was in and reports what an uninterrupted run reports.

  Args:
    config: a configs/finetune_dissect.py ConfigDict (e.g. `get_config('tiny')`).
    workdir: output folder (created).

  Returns:
    The `summarise` dict (also in workdir/results.json), plus 'plots' (PNG paths) on process 0.

  Raises:
    common.loop.Preempted: SIGTERM / SIGINT stopped a stage (its checkpoint is saved; run again to resume).
  """
  if config.data.name in fd_data.DATASETS:   # the paper's own data: read first (DataNotFoundError
    fd_data.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("finetune_dissect", config.data)   # run() does not train on it yet
  os.makedirs(workdir, exist_ok=True)
  stages = loop.Stages.from_config(config, workdir, label="finetune_dissect")
  study = finetune.synthetic_study(config, progress=print, stages=stages)
  results = summarise(study)
  with metrics_lib.open_writer(workdir) as writer:
    for i, step in enumerate(study["steps"]):
      row = {f"{m}/{k}": float(np.mean(c[k][:, i])) for m, c in study["methods"].items()
             for k in (*COMPONENTS, "total")}
      writer.write(int(step), row)
  if jax.process_index() == 0:
    results["plots"] = [plot_curves(study, os.path.join(workdir, "components.png")),
                        plot_positions(study, os.path.join(workdir, "by_position.png"))]
  metrics_lib.write_results(workdir, results)
  return results
