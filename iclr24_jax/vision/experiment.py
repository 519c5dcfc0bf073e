"""The `classify` experiment: train a classifier on an embedded data set and report test accuracy."""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import metrics as metrics_lib
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
