"""MDM experiments: run (one arm); `reproduce` and `benchmark` live in study.py.

run(config, workdir): trains one arm on MNIST-5k 32 -> 8 (or the tiny digits check) with `common.loop`:
  'progressive' (the low-resolution UNet first, loaded as the inner network, then the NestedUNet), 'nested'
  (from scratch) or 'single' (one UNet at 32x32); samples every level jointly with guidance, writes
  samples.png, metrics.jsonl and results.json (held-out eps-MSE per level, a CNN's accuracy on the samples).
reproduce(workdir, fast): the paper's "nested + progressive converges faster than a single-resolution model"
  at equal training compute (XLA FLOPs of each arm's train step; the progressive arm's inner pre-training counts),
  3 seeds vmapped into one program per arm, 3 checkpoints; held-out 32x32 eps-MSE, the MNIST CNN's accuracy on
  samples of the requested digit, sliced W2 of its features against the data-vs-data floor, and the cross-level
  consistency of joint samples; claims judged with `common.stats`.
benchmark(quick): train step/s of the NestedUNet vs the single-resolution UNet, 1 and all devices.

Where things are: the model in `model.py`; losses, steps and samplers in `train.py`; the pieces a run and the
study share (data, networks from a config, held-out MSE, the compiled arm programs, FLOPs per step) in
`programs.py`; the sample judge (MNIST CNN) in `judge.py`; `reproduce`, `qualify` and `benchmark` in `study.py`.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.mdm import model as model_lib
from iclr24_jax.papers.mdm import train
from iclr24_jax.papers.mdm.judge import train_judge
from iclr24_jax.papers.mdm.programs import build, heldout_mse, inner_kwargs, load_images, loss_kwargs
from iclr24_jax.papers.mdm import data as mdm_data

PAPER = "mdm"
ARMS = ("progressive", "nested", "single")
ARM_NAMES = {"progressive": "nested+progressive", "nested": "nested (scratch)", "single": "single-res 32x32"}


# ------------------------------------------------------------------------------------------------ run


def _train(config, workdir, model, scheds, image_shape, arrays, num_steps, loss_kw, init_params=None, name="train"):
  tx = make_optimizer(config.optimizer, num_steps)

  def init_fn(key):
    p = train.init_params(key, model, image_shape)
    if init_params is not None:
      p = model_lib.load_inner(p, init_params)
    return TrainState.create(p, tx)

  stream = data_lib.BatchStream(arrays, config.batch_size, seed=config.seed)
  step = train.make_train_step(model, scheds, **loss_kw)
  n_dev = int(config.get("mesh_devices", 0) or 0)
  mesh = sharding.make_mesh(config.get("mesh"), devices=jax.devices()[:n_dev] if n_dev else None)
  return loop_lib.train_loop(init_fn=init_fn, train_step=step, batches=stream, num_steps=num_steps,
                             key=jax.random.key(config.seed), workdir=workdir, mesh=mesh, log_every=config.log_every,
                             config=config, name=name, **loop_lib.checkpoint_options(config))


def run(config: Any, workdir: str) -> dict:
  """Trains one arm (config.arm), samples it jointly, writes samples.png, metrics.jsonl and results.json.

  Args:
    config: the mdm ConfigDict (`configs/mdm.py`): arm (one of ARMS), data, model, diffusion, optimizer,
      num_steps, sampler / judge settings.
    workdir: output folder (created).

  Returns:
    results dict: arm, image_size, factor, power, train_seconds, first_loss, final_loss, steps_per_s,
    heldout_eps_mse (list, see `heldout_mse`), consistency_mse (more than one level), and with
    config.judge.enabled samples_* (`Judge.score`) and judge_test_accuracy.

  Raises:
    ValueError: config.arm not in ARMS.
    FloatingPointError: the samples contain NaN / inf.
  """
  if config.data.name in mdm_data.DATASETS:   # the paper's own data: read first (DataNotFoundError
    mdm_data.load(config.data)                  # naming the layout and source when absent)
    raise data_lib.paper_data_not_wired("mdm", config.data)   # run() does not train on it yet
  os.makedirs(workdir, exist_ok=True)
  if config.arm not in ARMS:
    raise ValueError(f"config.arm must be one of {ARMS}, got {config.arm!r}.")
  ds, arrays = load_images(config.data)
  nets = build(config)
  train_arrays = {"x": arrays["x_train"], "y": arrays["y_train"]}
  lkw = loss_kwargs(config)
  t0 = time.time()
  results: dict[str, Any] = {"arm": config.arm, "image_size": nets["image_shape"][0], "factor": nets["factor"],
                             "power": float(config.diffusion.power)}
  if config.arm == "single":
    model, scheds = nets["single"], nets["schedules"]["single"]
    res = _train(config, workdir, model, scheds, nets["image_shape"], train_arrays, config.num_steps, lkw,
                 name="mdm/single")
  else:
    model, scheds = nets["nested"], nets["schedules"]["nested"]
    inner_params = None
    if config.arm == "progressive":
      low_shape = train.level_shapes(model, 1, nets["image_shape"])[1][1:]
      low_arrays = {"x": np.asarray(train.model_pyramid(model, jnp.asarray(arrays["x_train"]))[1]),
                    "y": arrays["y_train"]}
      res_in = _train(config, os.path.join(workdir, "inner"), nets["inner"], nets["schedules"]["inner"], low_shape,
                      low_arrays, config.inner_steps, inner_kwargs(config), name="mdm/inner")
      inner_params = jax.device_get(res_in.state.params)
      results["inner_final_loss"] = (res_in.history[-1].get("train/loss") if res_in.history else None)
    res = _train(config, workdir, model, scheds, nets["image_shape"], train_arrays, config.num_steps, lkw,
                 init_params=inner_params, name=f"mdm/{config.arm}")
  results["train_seconds"] = time.time() - t0
  params = jax.device_put(jax.device_get(res.state.params), jax.devices()[0])
  losses = [r["train/loss"] for r in res.history if "train/loss" in r]
  results.update(first_loss=losses[0] if losses else None, final_loss=losses[-1] if losses else None,
                 steps_per_s=res.steps_per_s)
  compile_ = loop_lib.compile_fast if config.get("fast_compile", False) else lambda f, *a: jax.jit(f)
  n_eval = min(256, arrays["x_eval"].shape[0])
  ev = (params, jnp.asarray(arrays["x_eval"][:n_eval]), jnp.asarray(arrays["y_eval"][:n_eval]))
  mse_fn = lambda p, x, y: heldout_mse(model, p, scheds, x, y, jax.random.key(123), lkw)  # noqa: E731
  results["heldout_eps_mse"] = [float(v) for v in np.asarray(compile_(mse_fn, *ev)(*ev))]

  s = config.sampler
  labels = jnp.arange(int(s.num_samples)) % 10
  sample_fn = functools.partial(
      train.sample, model=model, schedules=scheds, image_shape=nets["image_shape"], guidance_scale=s.guidance_scale,
      num_steps=int(s.num_steps), method=s.method, eta=float(s.eta), prediction=config.diffusion.prediction,
      clip_x0=s.clip_x0)
  smp_args = (jax.random.key(config.seed + 1), params, labels)
  smp = lambda k, p, y: sample_fn(k, p, labels=y)  # noqa: E731
  levels = [np.asarray(v) for v in compile_(smp, *smp_args)(*smp_args)]
  if not all(np.all(np.isfinite(v)) for v in levels):
    raise FloatingPointError("the sampler produced NaN/inf; lower the learning rate.")
  if len(levels) > 1:
    results["consistency_mse"] = float(np.mean(train.consistency([jnp.asarray(v) for v in levels], model)))
  if config.judge.enabled:
    judge = train_judge(config.judge, arrays)
    results.update({f"samples_{k}": v for k, v in judge.score(levels[0], np.asarray(labels)).items()})
    results["judge_test_accuracy"] = judge.test_accuracy
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0:
    _plot_levels(levels, np.asarray(labels), os.path.join(workdir, "samples.png"),
                 f"mdm {config.arm}: joint samples (rows: digit; left high-res, right low-res upsampled)")
  return results


def _plot_levels(levels, labels, path, title, per_class=4):
  """A grid: each row one digit, per sample the high-res image and every lower level (nearest upsampling)."""
  order = np.concatenate([np.where(labels == c)[0][:per_class] for c in range(10)])
  size = levels[0].shape[1]
  tiles = []
  for i in order:
    row = [levels[0][i]]
    for lv in levels[1:]:
      rep = size // lv.shape[1]
      row.append(np.repeat(np.repeat(lv[i], rep, 0), rep, 1))
    tiles.extend(row)
  grid = (np.stack(tiles) + 1.0) / 2.0
  return metrics_lib.plot_image_grid(grid, path, ncols=per_class * len(levels), title=title)
