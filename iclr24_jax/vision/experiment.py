"""The `classify` experiment: train a classifier on an embedded data set and report test accuracy."""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.vision import classify


def run(config: Any, workdir: str) -> dict:
  """Trains config.model on config.data; writes metrics.jsonl, checkpoints, results.json, plots.

  Args:
    config: the classify ConfigDict (`configs/classify.py`): data {name, data_dir}, model, optimizer,
      num_steps, batch_size, seed, log / eval / checkpoint cadence.
    workdir: output folder (resumes from its checkpoints); plots curves.png and test_predictions.png.

  Returns:
    results dict: data (`describe`), test_accuracy, test_loss, final_eval, resumed_from_step, steps_per_s,
    num_steps.
  """
  ds = data_lib.load_dataset(config.data.name, config.data.get("data_dir") or None)
  model, res = classify.train_classifier(config, ds, workdir=workdir)
  test = classify.evaluate(model, res.state, ds.test)
  results = {"data": data_lib.describe(ds), "test_accuracy": test["accuracy"], "test_loss": test["loss"],
             "final_eval": res.final_eval, "resumed_from_step": res.start_step, "steps_per_s": res.steps_per_s,
             "num_steps": config.num_steps}
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0:
    rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    metrics_lib.plot_curves(rows, ["train/loss", "train/accuracy", "eval/val_accuracy"],
                            os.path.join(workdir, "curves.png"), title=f"{ds.name} {config.model.name}")
    logits = classify.predict(model, res.state, ds.test.x[:16])
    metrics_lib.plot_image_grid(ds.test.x[:16], os.path.join(workdir, "test_predictions.png"),
                                title="pred: " + " ".join(str(int(p)) for p in np.argmax(logits, -1)))
  return results


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  """Digits CNN (default config) test accuracy vs the >= 95% the foundation promises.

  Args:
    workdir: output folder (the run goes to workdir/classify).
    fast: train the 'tiny' config variant; the row's holds is then None.

  Returns:
    one reproduction row dict in a list.
  """
  from iclr24_jax.configs import classify as cfg_mod
  cfg = cfg_mod.get_config("tiny" if fast else "")
  res = run(cfg, os.path.join(workdir, "classify"))
  acc = res["test_accuracy"]
  return [{"paper": "classify", "experiment": f"digits CNN, {cfg.num_steps} steps", "metric": "test accuracy",
           "ours": acc, "paper_value": ">= 0.95 (foundation check)", "holds": bool(acc >= 0.95) if not fast else None,
           "kind": "check",
           "plots": [os.path.join(workdir, "classify", "curves.png")]}]


def benchmark(quick: bool = True) -> list[dict]:
  """Classifier train step/s on 1 and all devices, at two batch sizes."""
  from iclr24_jax.configs import classify as cfg_mod
  cfg = cfg_mod.get_config("")
  ds = data_lib.load_digits()
  model = classify.create_model(cfg.model, ds.num_classes)
  tx = classify.make_optimizer(cfg.optimizer, cfg.num_steps)
  step = classify.make_train_step(model)

  def make_case(mesh, bs):
    from iclr24_jax.common.loop import compile_step
    state = jax.jit(lambda k: classify.init(k, model, ds.input_shape, tx),
                    out_shardings=sharding.replicated_sharding(mesh))(jax.random.key(0))
    idx = np.arange(bs) % len(ds.train)
    batch = sharding.shard_batch({"x": ds.train.x[idx], "y": ds.train.y[idx]}, mesh)
    return (compile_step(step, mesh), (state, batch, jax.random.key(1)),
            dict(items=bs, name="classify/cnn_train_step", batch=bs))

  return bench.across_devices(make_case, sizes=(64, 512), carry=True, repeats=5 if quick else 20)
