"""nci launcher: `run(config, workdir)`, one method on one target domain through the shared loop.

The seed-batched leave-one-out runs (`setup`, `adv_weight`, `ramp_steps`, `make_train_fn`, `leave_one_out`) are
in `train.py` with the train steps; the reproduction study and the benchmark are in `study.py`.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.papers.nci import data as data_lib
from iclr24_jax.papers.nci import model as model_lib
from iclr24_jax.papers.nci import train as train_lib

METHODS = train_lib.METHODS


def run(config: Any, workdir: str) -> dict:
  """One method on one target domain through the shared loop (metrics, checkpoints, resume, plots)."""
  if config.data.name in data_lib.DATASETS:   # the paper's own data: read first (DataNotFoundError
    data_lib.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("nci", config.data)   # run() does not train on it yet
  method, target = config.method, config.data.target
  if method not in METHODS:
    raise ValueError(f"unknown method '{method}'; choose one of {METHODS}.")
  sources, uda, evl, nets, tx_m, tx_d = train_lib.setup(config, target, method)
  sx, sy, sn = data_lib.stack_padded(sources)
  k, bs = len(sources), config.batch_size
  step = train_lib.make_train_step(nets, "erm" if method == "oracle" else method, train_lib.adv_weight(config, k),
                                   ramp_steps=train_lib.ramp_steps(config, method) or 0)
  input_shape = sx.shape[2:]

  def batches(s):  # deterministic in the step, so a resumed run sees the same data
    rng = np.random.default_rng([config.seed, s])
    idx = (rng.random((k, bs)) * sn[:, None]).astype(np.int64)
    it = rng.integers(0, len(uda.y), bs)
    return {"sx": np.swapaxes(sx[np.arange(k)[:, None], idx], 0, 1), "sy": sy[np.arange(k)[:, None], idx].T,
            "tx": uda.x[it]}

  def loop_step(state, batch, key):  # batch rows lead (sharded over 'data'); the method wants [K, B]
    src = {"x": jnp.swapaxes(batch["sx"], 0, 1), "y": batch["sy"].T}
    return step(state, src, batch["tx"], key)

  def eval_fn(state):
    return {"target_acc": train_lib.evaluate(nets, state.params, evl.x, evl.y)}

  res = loop_lib.train_loop(
      init_fn=lambda key: model_lib.init(key, nets, input_shape, tx_m, tx_d), train_step=loop_step, batches=batches,
      num_steps=config.num_steps, key=jax.random.key(config.seed), workdir=workdir,
      mesh=sharding.make_mesh(config.get("mesh")), log_every=config.log_every, eval_every=config.eval_every,
      eval_fn=eval_fn, config=config, name=f"nci/{method}", **loop_lib.checkpoint_options(config))
  src_acc = float(np.mean([train_lib.evaluate(nets, res.state.params, d.x, d.y) for d in sources]))
  results = {"method": method, "target": target, "target_acc": res.final_eval["eval/target_acc"],
             "source_acc": src_acc, "resumed_from_step": res.start_step, "steps_per_s": res.steps_per_s}
  metrics_lib.write_results(workdir, results)
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  metrics_lib.plot_curves(rows, ["train/nll", "train/d_acc", "eval/target_acc"], os.path.join(workdir, "curves.png"),
                          title=f"{method}: target {target}")
  return results
