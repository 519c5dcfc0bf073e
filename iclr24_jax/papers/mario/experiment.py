"""MaRio experiment: `run(config, workdir)`: SFT, Quark rounds, and SFT vs MaRio on held-out questions.

The reproduction (controllability, SFT vs MaRio with bootstrap intervals, the silver reference) and the benchmark
are in `study.py`.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import loop
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.papers.mario import data as mario_data
from iclr24_jax.papers.mario import train


def run(config: Any, workdir: str) -> dict:
  """Trains SFT then MaRio on config.data (train split) and evaluates both on the test split.

  Writes workdir/metrics.jsonl (train metrics), workdir/samples.json (responses) and workdir/results.json; the
  training stages checkpoint in workdir/<stage>/ (`train.train_mario`), so a killed run resumes where it was.

  Args:
    config: a configs/mario.py ConfigDict (e.g. `get_config('tiny')`).
    workdir: output folder (created).

  Returns:
    {'sft': {reward: mean}, 'mario': {reward: mean}, 'mario_worst': {...}, 'sft_matched' (with
    config.sft_matched), 'timing': {...}, ...}.

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped a stage (its checkpoint is saved; a rerun resumes it).
  """
  os.makedirs(workdir, exist_ok=True)
  mario_data.load(config.data)   # fail fast with the layout and source before any model is loaded
  data_dir = config.data.get("data_dir") or None
  train_items = train.load_items(config.data.name, "train", data_dir, limit=int(config.data.num_train),
                                    silver_only=True, seed=int(config.seed))
  test_items = train.load_items(config.data.name, "test", data_dir, limit=int(config.data.num_eval),
                                   seed=int(config.seed) + 1)
  texts = [it["question"] + " " + it["rationale"] for it in train_items]
  models = train.load_models(config, texts)
  train_items = train.short_items(models, train_items, int(config.data.get("max_response_tokens", 0)))
  # SFT and every Quark round resume in workdir/<stage> (sft, quark<r>, sft_matched<r>)
  out = train.train_mario(config, models, train_items, stages=loop.Stages.from_config(config, workdir, label="mario"))
  names = tuple(config.rewards) + ("accuracy",)
  evals = {"sft": train.evaluate(models, config, out["sft"], test_items, None),
           "mario": train.evaluate(models, config, out["mario"], test_items, models.codes.best()),
           "mario_worst": train.evaluate(models, config, out["mario"], test_items, models.codes.worst())}
  if out.get("sft_matched") is not None:   # config.sft_matched: SFT given the Quark steps too
    evals["sft_matched"] = train.evaluate(models, config, out["sft_matched"], test_items, None)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for row in out["history"]:
      f.write(json.dumps(metrics_lib.to_python(row)) + "\n")
  samples = [{"question": it["question"], "gold": it["answer"],
              **{k: evals[k]["responses"][i] for k in evals}} for i, it in enumerate(test_items)]
  with open(os.path.join(workdir, "samples.json"), "w") as f:
    json.dump(samples, f, indent=1)
  results = {k: {n: float(np.mean(v[n])) for n in names} | {"valid": float(np.mean(v["valid"]))}
             for k, v in evals.items()}
  results.update({"num_train": len(train_items), "num_eval": len(test_items), "pool_size": len(out["pool"]),
                  "timing": out["timing"], "final_train": out["history"][-1] if out["history"] else {}})
  if jax.process_index() == 0:
    metrics_lib.write_results(workdir, results)
  return results
