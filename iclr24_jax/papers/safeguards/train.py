"""The safeguard's training pipeline: concept detectors -> calibration -> front end -> propagated Pr(y | x).

`train_detectors` (the K concept detectors through the shared loop), `predict_logits`, `build_safeguard` (detectors,
Platt/isotonic calibration on validation, the logistic front end, and exact / Monte Carlo propagation), and
`train_selective_baseline` (the selective classifier on x). The coverage-vs-budget evaluation is in
`evaluation.py`; `experiment.run` is the launcher; the reproduction study is in `study.py`.
"""
from __future__ import annotations

import functools
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.papers.safeguards import data as sg_data
from iclr24_jax.papers.safeguards import model as sg_model
from iclr24_jax.papers.safeguards import propagation
from iclr24_jax.vision import classify

# Compiled once per shape (the library functions stay un-jitted; the pipeline compiles them here).
propagate_compiled = jax.jit(propagation.propagate,
                             static_argnames=("method", "num_samples", "front_end_fn", "chunk_size"))
_fit_calibration = jax.jit(sg_model.fit_calibration, static_argnames=("method", "num_iters"))
_fit_front_end = jax.jit(sg_model.fit_front_end, static_argnames=("num_iters",))


# ----------------------------------------------------------------------------------------------- training
@functools.lru_cache(maxsize=16)   # one jitted function per static value: jit caches by function identity
def _forward(model):
  return jax.jit(lambda params, extra, x: classify.apply_model(model, params, extra, x, train=False)[0])


def predict_logits(model, state, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
  """Logits [N, ...] of `model` on x in fixed-size padded batches (one compile per model and input shape)."""
  fwd, n = _forward(model), x.shape[0]
  outs = [np.asarray(fwd(state.params, state.extra, batch["x"]))
          for batch, _ in data_lib.eval_batches({"x": x}, batch_size)]
  return np.concatenate(outs)[:n]


def train_detectors(config: Any, ds: sg_data.ConceptDataset, workdir: str | None, mesh=None, progress: bool = True):
  """Trains the K concept detectors with the shared loop (metrics.jsonl and checkpoints in `workdir`).

  Returns:
    (model, state).
  """
  model = sg_model.create_detector(config.model, ds.num_concepts)
  tx = make_optimizer(config.optimizer, config.num_steps)
  stream = data_lib.BatchStream({"x": ds.train.x, "c": ds.train.c}, config.batch_size, seed=config.seed)
  init_fn = functools.partial(classify.init, model=model, input_shape=ds.input_shape, tx=tx)
  mesh = sharding.make_mesh(config.get("mesh")) if mesh is None else mesh

  def eval_fn(state):
    logits = predict_logits(model, state, ds.val.x)
    c = ds.val.c
    bce = np.mean(np.maximum(logits, 0) - logits * c + np.log1p(np.exp(-np.abs(logits))))
    return {"val_bce": float(bce), "val_concept_accuracy": float(np.mean((logits > 0) == (c > 0.5)))}

  save = workdir is not None and config.get("save_checkpoints", True)
  res = loop_lib.train_loop(init_fn=init_fn, train_step=sg_model.make_detector_train_step(model), batches=stream,
                            num_steps=config.num_steps, key=jax.random.key(config.seed),
                            workdir=workdir if save else None, mesh=mesh, log_every=config.log_every,
                            eval_every=config.eval_every, eval_fn=eval_fn, config=config, progress=progress,
                            name="safeguards/detectors", steps_per_call=int(config.get("steps_per_call", 1)),
                            **loop_lib.checkpoint_options(config))
  if workdir is not None and not save:   # no checkpoints: still leave the training curve in metrics.jsonl
    with metrics_lib.open_writer(workdir) as writer:
      for row in res.history:
        writer.write(row["step"], {k: v for k, v in row.items() if k != "step"})
  return model, res


def train_selective_baseline(config: Any, ds: sg_data.ConceptDataset, workdir: str | None, progress: bool = True
                             ) -> dict[str, np.ndarray]:
  """The selective classifier on x: a classifier x -> y, Platt-calibrated on validation.

  Returns:
    {'val': [N_val] Pr(y=1|x), 'test': [N_test] Pr(y=1|x)}.
  """
  b = config.baseline
  cfg = ml_collections.ConfigDict(dict(seed=config.seed, model=b.model.to_dict(), optimizer=config.optimizer.to_dict(),
                                       num_steps=b.num_steps, batch_size=config.batch_size,
                                       log_every=config.log_every, eval_every=0, checkpoint_every=0,
                                       mesh=config.mesh.to_dict()))
  dset = data_lib.Dataset(ds.name, data_lib.Split(ds.train.x, ds.train.y), data_lib.Split(ds.val.x, ds.val.y),
                          data_lib.Split(ds.test.x, ds.test.y), num_classes=2)
  save = workdir is not None and config.get("save_checkpoints", True)
  model, res = classify.train_classifier(cfg, dset, workdir=workdir if save else None, progress=progress)

  def margin(x):
    logits = predict_logits(model, res.state, x)
    return (logits[:, 1] - logits[:, 0])[:, None]

  cal = _fit_calibration(margin(ds.val.x), ds.val.y[:, None].astype(np.float32), config.calibration.method)
  return {split: np.asarray(sg_model.calibrated_probs(margin(getattr(ds, split).x), cal))[:, 0]
          for split in ("val", "test")}


def build_safeguard(config: Any, ds: sg_data.ConceptDataset, workdir: str | None, progress: bool = True
                    ) -> dict[str, Any]:
  """Detectors -> calibration -> front end -> propagated Pr(y | x) on validation and test.

  Returns:
    dict with the detector, its final eval, calibration, calibrated probs {'val', 'test'} [N, K], the front-end
    params, y_bar {'val', 'test'} [N] and the wall time.
  """
  t0 = time.time()
  model, res = train_detectors(config, ds, workdir, progress=progress)
  logits = {s: predict_logits(model, res.state, getattr(ds, s).x) for s in ("val", "test")}
  cal = _fit_calibration(logits["val"], ds.val.c, config.calibration.method)
  probs = {s: np.asarray(sg_model.calibrated_probs(logits[s], cal)) for s in ("val", "test")}
  front = _fit_front_end(ds.train.c, ds.train.y, config.front_end.inverse_c, num_iters=config.front_end.num_iters)
  sc = config.safeguard
  key = jax.random.key(config.seed)
  y_bar = {s: np.asarray(propagate_compiled(probs[s], front, sc.method, key, sc.num_samples)) for s in ("val", "test")}
  return {"detector": model, "detector_state": res.state, "detector_eval": res.final_eval, "calibration": cal,
          "probs": probs, "front_end": front, "y_bar": y_bar, "train_s": time.time() - t0}
