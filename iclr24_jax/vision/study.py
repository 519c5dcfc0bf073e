"""The `classify` family check's studies: `reproduce` (the digits CNN's test accuracy against the foundation's
>= 95%) and `benchmark` (classifier train step/s on 1 and all devices). `reproduce` trains with `experiment.run`."""
from __future__ import annotations

import os
from typing import Any, Callable

import jax
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import sharding
from iclr24_jax.vision import classify
from iclr24_jax.vision.experiment import run


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Digits CNN (default config) test accuracy vs the >= 95% the foundation promises.

  Args:
    workdir: output folder (the run goes to workdir/classify).
    fast: train the 'tiny' config variant; the row's holds is then None.
    get_config: `get_config(variant)` of configs/classify.py (the runners pass it; tests pass the module's).

  Returns:
    one reproduction row dict in a list.
  """
  cfg = get_config("tiny" if fast else "")
  res = run(cfg, os.path.join(workdir, "classify"))
  acc = res["test_accuracy"]
  return [{"paper": "classify", "experiment": f"digits CNN, {cfg.num_steps} steps", "metric": "test accuracy",
           "ours": acc, "paper_value": ">= 0.95 (foundation check)", "holds": bool(acc >= 0.95) if not fast else None,
           "kind": "check",
           "plots": [os.path.join(workdir, "classify", "curves.png")]}]


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Classifier train step/s on 1 and all devices, at two batch sizes."""
  cfg = get_config("")
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
