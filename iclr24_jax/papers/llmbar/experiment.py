"""LLMBar experiments: run an evaluator on LLMBar (`reproduce` and `benchmark` live in study.py).

  python -m experiments.main --config=configs/llmbar.py --workdir=runs/llmbar            # SmolLM2 + Vanilla, 419
  python -m experiments.main --config=configs/llmbar.py:rules_metrics_reference --workdir=runs/llmbar_rmr
  python -m experiments.main --config=configs/llmbar.py:tiny --workdir=/tmp/llmbar_tiny   # fake judge, seconds

Generations are cached in `<workdir>/generations.jsonl` (or config.cache_dir), so an interrupted run resumes
where it stopped when launched again with the same workdir.
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.lm import annotate
from iclr24_jax.lm import cache as cache_lib
from iclr24_jax.papers.llmbar import data as data_lib
from iclr24_jax.papers.llmbar import evaluator
from iclr24_jax.papers.llmbar import model as model_lib
from iclr24_jax.papers.llmbar import scoring as scoring_lib

# The paper's numbers (Table 2 / the official statistics.json files, princeton-nlp/LLMBar @ caa7bee):
# {evaluator: {subset: (accuracy %, positional agreement %)}}; 'Adversarial' = mean of the four subsets.
PAPER = {
    "GPT-4 Vanilla": {"Natural": (93.5, 97.0), "Neighbor": (64.2, 89.6), "GPTInst": (76.6, 90.2),
                      "GPTOut": (76.6, 87.2), "Manual": (75.0, 89.1), "Adversarial": (73.1, 89.0)},
    "GPT-4 Rules+Metrics+Reference": {"Natural": (96.0, 96.0), "Neighbor": (85.4, 94.8), "GPTInst": (89.7, 90.2),
                                      "GPTOut": (72.3, 83.0), "Manual": (83.7, 84.8), "Adversarial": (82.8, 88.2)},
    "ChatGPT Vanilla": {"Natural": (79.0, 68.0), "Neighbor": (17.9, 73.1), "GPTInst": (29.3, 52.2),
                        "GPTOut": (43.6, 42.6), "Manual": (37.0, 47.8), "Adversarial": (32.0, 53.9)},
}
PAPER_FOR = {"vanilla": "GPT-4 Vanilla", "rules_metrics_reference": "GPT-4 Rules+Metrics+Reference"}


def make_judge(model_config: Any):
  """The judge a config names: 'smollm2' (SmolLMJudge), 'fake' (FakeJudge) or 'constant' (ConstantJudge)."""
  name = model_config.name
  if name == "smollm2":
    return model_lib.SmolLMJudge(batch_size=model_config.batch_size, logit_bias=model_config.logit_bias,
                                 widths=tuple(model_config.widths))
  if name == "fake":
    return model_lib.FakeJudge(seed=model_config.get("seed", 0))
  if name == "constant":
    return annotate.ConstantJudge(model_config.get("answer", "Output (a)"))
  raise ValueError(f"unknown judge model {name!r}; choose 'smollm2', 'fake' or 'constant'.")


def _to_percent_table(subsets: dict) -> dict:
  out = {}
  for k, v in subsets.items():
    row = {"accuracy": 100 * v["accuracy"], "agreement": 100 * v["agreement"], "n": v["n"]}
    for f in ("raw_accuracy", "raw_agreement", "position_a_rate"):
      if f in v:
        row[f] = 100 * v[f]
    if "ci" in v:
      row["ci"] = [100 * v["ci"][0], 100 * v["ci"][1]]
    out[k] = row
  return out


def plot_subsets(tables: dict[str, dict], path: str, title: str = "") -> str:
  """Grouped bars: accuracy (and agreement, hatched) per subset for each evaluator in `tables`.

  Args:
    tables: {label: {subset: {'accuracy': %, 'agreement': %}}}.
    path: PNG path.
    title: figure title.

  Returns:
    path.
  """
  subsets = ["Natural", *data_lib.ADVERSARIAL, "Adversarial"]
  fig, axes = metrics_lib.new_figure(ncols=2, size=(6.0, 3.4))
  width = 0.8 / max(len(tables), 1)
  for ax, key in zip(axes[0], ("accuracy", "agreement")):
    for j, (label, table) in enumerate(tables.items()):
      vals = [table.get(s, {}).get(key, np.nan) for s in subsets]
      ax.bar(np.arange(len(subsets)) + (j - (len(tables) - 1) / 2) * width, vals, width, label=label)
    ax.axhline(50, color="k", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(subsets)))
    ax.set_xticklabels(subsets, rotation=30, fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel(f"{key} (%)")
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.06), ncol=min(len(tables), 4), fontsize=7)
  if title:
    fig.suptitle(title, fontsize=9)
  return metrics_lib.save_figure(fig, path)


def run(config: Any, workdir: str) -> dict:
  """Evaluates config.model with config.strategy on LLMBar (both orders, cached); writes results.json and a plot.

  Args:
    config: see configs/llmbar.py (judge_mode 'logprob' | 'generate' | 'auto', tie_tau, bootstrap).
    workdir: output folder (also holds the generation/score cache unless config.cache_dir is set).

  Returns:
    {'strategy', 'judge', 'judge_mode', 'subsets': {subset: {'accuracy', 'agreement', 'n', 'ci' [lo, hi],
    'raw_accuracy', 'raw_agreement', 'position_a_rate'} in %}, 'accuracy', 'agreement', 'failure_rate',
    'position_a_rate', 'mean_position_bias' and 'debiased_ties' (logprob mode), 'num_generations', 'cache_hits',
    'seconds', 'credit': {subset: per-pair credit list} (for paired comparisons), ...}.
  """
  os.makedirs(workdir, exist_ok=True)
  data = data_lib.load(config.data)   # DataNotFoundError (layout, source) when absent
  data = data_lib.stratified_subset(data, config.data.per_subset, config.seed)
  take = int(config.data.get("take_first", 0) or 0)
  if take > 0:  # the first pairs (file order) of each subset's sample: a sub-sample of a larger run's pairs
    data = {k: v[:take] for k, v in data.items()}
  judge = make_judge(config.model)
  cache_path = os.path.join(config.cache_dir or workdir, "generations.jsonl")
  cache = cache_lib.GenerationCache(cache_path) if config.use_cache else None
  boot = config.get("bootstrap", {"n_boot": 2000, "seed": 0})
  t0 = time.perf_counter()
  res = evaluator.evaluate_subsets(judge, data, config.strategy, max_new_tokens=dict(config.max_new_tokens),
                                   cache=cache, rating_ties=config.rating_ties, rating_strict=config.rating_strict,
                                   count_failures_as_agreement=config.count_failures_as_agreement,
                                   chunk_size=config.log_every, verbose=config.verbose,
                                   judge_mode=config.get("judge_mode", "auto"),
                                   tie_tau=config.get("tie_tau", evaluator.DEFAULT_TIE_TAU),
                                   debiased_ties=config.get("debiased_ties", "raw"),
                                   n_boot=int(boot["n_boot"]), boot_seed=int(boot["seed"]))
  seconds = time.perf_counter() - t0
  full = res["all"]
  table = _to_percent_table(res["subsets"])
  credit, start = {}, 0
  item_credit = scoring_lib.item_correctness(full["labels"], full["winners_original"], full["winners_swapped"])
  for name in data:
    credit[name] = item_credit[start:start + len(data[name])].tolist()
    start += len(data[name])
  results = {"strategy": config.strategy, "paper_name": evaluator.get_strategy(config.strategy).paper_name,
             "judge": getattr(judge, "model_id", config.model.name), "judge_mode": full["judge_mode"],
             "subsets": table, "accuracy": full["accuracy"], "agreement": full["agreement"],
             "failure_rate": full["failure_rate"], "position_a_rate": full["position_a_rate"],
             "raw_accuracy": full["raw_accuracy"], "raw_agreement": full["raw_agreement"],
             "mean_position_bias": full.get("mean_position_bias"), "tie_tau": config.get("tie_tau", None),
             "debiased_ties": full.get("debiased_ties"),
             "n": full["n"], "num_generations": full["num_generations"], "seconds": seconds,
             "cache_hits": cache.hits if cache else 0, "cache_path": cache_path if cache else None,
             "max_new_tokens": dict(config.max_new_tokens), "per_subset": config.data.per_subset, "credit": credit}
  metrics_lib.write_results(workdir, {"records": full["records"]}, filename="records.json")
  tables = {f"ours: {config.strategy} ({full['judge_mode']})": table}
  ref = PAPER.get(PAPER_FOR.get(config.strategy, "GPT-4 Vanilla"))
  tables[PAPER_FOR.get(config.strategy, "GPT-4 Vanilla") + " (paper)"] = {
      k: {"accuracy": a, "agreement": g} for k, (a, g) in ref.items()}
  results["plot"] = plot_subsets(tables, os.path.join(workdir, "subsets.png"),
                                 title=f"LLMBar, {results['judge']}, {config.strategy}, {full['judge_mode']}")
  metrics_lib.write_results(workdir, results)
  return results
