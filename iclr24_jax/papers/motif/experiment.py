"""Motif experiment: `run(config, workdir)` runs the whole pipeline on the toy captioned gridworld (data set of
captions -> annotated pairs -> reward model -> intrinsic reward -> PPO agents for each reward setting, vmapped
over seeds) or on NetHack (variant 'nethack').

The pieces it composes, and `study.reproduce` with it: `train.py` (`toy_env`, `toy_dataset`, `fit_from_records`,
`toy_settings`, `toy_agents`), `annotators.py` (`make_judge`, `annotate`, `cache_path`, `label_agreement`) and
`nethack_motif.py` (`nethack_pipeline`). This module keeps `run` and its plot `plot_toy`.
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

import jax
import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import loop
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.papers.motif import annotators, nethack_motif, toy, train
from iclr24_jax.papers.motif import data as motif_data


def plot_toy(agents: dict, names: Sequence[str], path: str, title: str) -> str:
  """Success rate (mean +- SE over seeds) per setting and the training curves.

  Args:
    agents: `toy_agents` output.
    names: S setting labels, in the settings' order.
    path: PNG output path.
    title: the left panel's title.

  Returns:
    path.
  """
  fig, axes = metrics_lib.new_figure(ncols=2, size=(10.0, 3.6))
  s = agents["final"]["success"]
  n = s.shape[1]
  ax = axes[0, 0]
  ax.bar(range(len(names)), s.mean(1), yerr=s.std(1, ddof=1) / np.sqrt(n) if n > 1 else None, capsize=3)
  ax.set_xticks(range(len(names)))
  ax.set_xticklabels(names, rotation=20, fontsize=7)
  ax.set_ylabel(f"success rate (final policy, {n} seeds)")
  ax.set_title(title, fontsize=9)
  ax = axes[0, 1]
  for i, name in enumerate(names):
    ax.plot(agents["curves"]["episode_return"][i].mean(0), label=name)
  ax.set_xlabel("PPO update")
  ax.set_ylabel("extrinsic return of finished episodes")
  ax.legend(fontsize=6)
  return metrics_lib.save_figure(fig, path)


def run(config: Any, workdir: str) -> dict:
  """The Motif pipeline for config.env.name ('toy' or 'nethack'); writes results.json, metrics.jsonl, plots.

  The reward model and the agents are resumable stages (their checkpoints and metrics.jsonl; a killed run resumes
  inside the stage it was in): the toy world's in `workdir/reward_model` and `workdir/agents`, NetHack's in
  `workdir/reward_model` and `workdir/agents_<setting>` (one per reward setting; the games mid-episode are saved
  as their replays). The annotations resume from their cache in both.

  Args:
    config: the motif ConfigDict (`configs/motif.py`).
    workdir: output folder (created).

  Returns:
    results dict (JSON-ready): toy: annotator, captions, pairs, agreement_with_oracle, reward_model, agents,
    agent_seconds, env_steps, plots; nethack: the `nethack_pipeline` summary.

  Raises:
    ValueError: unknown env.name, or the oracle annotator on NetHack.
  """
  if config.data.name in motif_data.DATASETS:   # the paper's own data: read first (DataNotFoundError
    motif_data.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("motif", config.data)   # run() does not train on it yet
  os.makedirs(workdir, exist_ok=True)
  key = jax.random.key(int(config.seed))
  k_data, k_reward, k_agents = jax.random.split(key, 3)
  if config.env.name == "nethack":
    kind = config.annotation.annotator
    if kind == "oracle":
      raise ValueError("the oracle annotator exists only for the toy world; use annotator 'smollm2', "
                       "'generate' or 'keywords' for NetHack.")
    judge, name = annotators.make_judge(config)
    res = nethack_motif.nethack_pipeline(config, workdir, judge, name,
                                         stages=loop.Stages.from_config(config, workdir, label="motif"))
    with metrics_lib.open_writer(workdir) as writer:
      for kind_, r in res["runs"].items():
        for h in r["history"]:
          writer.write(int(h["update"]), {f"{kind_}/{k}": v for k, v in h.items() if isinstance(v, (int, float))})
    results = {k: v for k, v in res.items() if k != "runs"}
    results["runs"] = {k: {kk: vv for kk, vv in r.items() if kk != "history"} for k, r in res["runs"].items()}
    metrics_lib.write_results(workdir, metrics_lib.to_python(results))
    return metrics_lib.to_python(results)
  if config.env.name != "toy":
    raise ValueError(f"unknown env.name '{config.env.name}'; choose 'toy' or 'nethack'.")
  env = train.toy_env(config)
  captions = train.toy_dataset(config, env, k_data)
  pairs = train.sample_pairs(captions, int(config.data.num_pairs), int(config.seed))
  judge, name = annotators.make_judge(config)
  task = config.annotation.task or toy.TASK
  records = annotators.annotate(config, pairs, task, judge, name, annotators.cache_path(config, workdir, name.replace("/", "_")))
  agree = annotators.label_agreement(records)
  # The reward model and the agents resume in workdir/reward_model and workdir/agents (the annotations are cached)
  stages = loop.Stages.from_config(config, workdir, label="motif")
  fitted = train.fit_from_records(config, records, k_reward, stages=stages)
  settings = [(name, s) for s in config.intrinsic.settings]
  names = [s for _, s in settings]
  agents = train.toy_agents(config, env, train.toy_settings(config, {name: fitted}, settings), k_agents,
                            int(config.num_seeds), stages=stages, names=names)
  plot = plot_toy(agents, names, os.path.join(workdir, "toy_success.png"), f"toy world, labels: {name}")
  fit = fitted["fit"]
  results = {
      "annotator": name, "captions": len(captions), "pairs": len(records),
      "agreement_with_oracle": {k: v for k, v in agree.items() if k != "correct"},
      "reward_model": {"train_accuracy": fitted["train_accuracy"], "heldout_accuracy": fitted["heldout_accuracy"],
                       "heldout_n": fitted["heldout_n"],
                       "heldout_oracle_accuracy": fitted["heldout_oracle_accuracy"],
                       "mu": fit["mu"], "sigma": fit["sigma"], "eps": fit["eps"],
                       "normalised_caption_rewards": dict(zip(toy.CAPTIONS, ((fitted["caption_rewards"] - fit["mu"])
                                                                              / fit["sigma"]).tolist()))},
      "agents": {n: {k: v[i].tolist() for k, v in agents["final"].items()} for i, n in enumerate(names)},
      "agent_seconds": agents["seconds"], "env_steps": agents["env_steps"], "plots": [plot],
  }
  results = metrics_lib.to_python(results)
  metrics_lib.write_results(workdir, results)
  with open(os.path.join(workdir, "annotations.json"), "w") as f:
    json.dump(records, f)
  return results
