"""The `diffusion` family check.

run(): trains a (class-conditional) UNet DDPM on scikit-learn digits (8x8, or upsampled to 16x16), samples it with
DDIM / DDPM (+ classifier-free guidance), and writes the samples (samples.npz) and sample grids. Whether the
samples show the digits they were asked for is judged by the study (`study.judge_run`, a digits CNN from
`vision.judge`): a family imports no other family. The reproduction and the benchmark are in `study.py`.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.diffusion import samplers, schedules, train, unet

# ----------------------------------------------------------------------------------------------- data


def digits_images(split: data_lib.Split, image_size: int) -> np.ndarray:
  """Digits [N, 8, 8, 1] in [0, 1] -> [N, S, S, 1] in [-1, 1] (bilinear upsampling when S > 8).

  Args:
    split: Split with x [N, h, h, 1] float32 in [0, 1] (h = 8 for digits).
    image_size: S, a multiple of h.

  Returns:
    float32 numpy [N, S, S, 1] in [-1, 1].

  Raises:
    ValueError: S is not a multiple of h.
  """
  x = np.asarray(split.x, np.float32)
  if image_size != x.shape[1]:
    if image_size % x.shape[1]:
      raise ValueError(f"data.image_size must be a multiple of the data's {x.shape[1]}-pixel images, got "
                       f"{image_size}.")
    x = np.asarray(jax.image.resize(x, (x.shape[0], image_size, image_size, 1), "linear"))
  return 2.0 * x - 1.0


# -------------------------------------------------------------------------------------------- run


def make_sample_fn(model, schedule, cfg: Any, num_classes: int):
  """A jitted (params, key, labels) -> samples function following config.sampler.

  Args:
    model: the UNet module.
    schedule: the noise schedule.
    cfg: the experiment config (sampler: method, num_steps, eta, clip_x0, guidance_scale; diffusion.prediction).
    num_classes: K > 0 for a class-conditional UNet (null class id K for guidance), 0 for unconditional.

  Returns:
    sample_fn(params, key, labels [N] int (ignored when unconditional), shape (static, e.g. (N, S, S, 1)))
    -> samples of `shape`.
  """
  s = cfg.sampler

  @functools.partial(jax.jit, static_argnums=(3,))
  def sample_fn(params, key, labels, shape):
    kw = dict(method=s.method, num_steps=int(s.num_steps), eta=float(s.eta), prediction=cfg.diffusion.prediction,
              clip_x0=(float(s.clip_x0) if s.get("clip_x0") else None))
    if num_classes:
      den = train.make_denoiser(model, params, cond_name="class_labels")
      if s.get("guidance_scale") is not None:
        return samplers.sample(key, den, schedule, shape, cond=labels,
                               null_cond=jnp.full_like(labels, num_classes), guidance_scale=float(s.guidance_scale),
                               **kw)
      return samplers.sample(key, den, schedule, shape, cond=labels, **kw)
    return samplers.sample(key, train.make_denoiser(model, params), schedule, shape, **kw)

  return sample_fn


def run(config: Any, workdir: str) -> dict:
  """Trains the digits DDPM and samples it; writes metrics.jsonl, results.json, samples.npz and PNGs.

  Args:
    config: the diffusion ConfigDict (`configs/diffusion.py`): data, model, schedule, diffusion, optimizer,
      sampler, classifier, num_steps, ...
    workdir: output folder (created; resumes from its checkpoints).

  Returns:
    results dict: num_steps, image_size, schedule, prediction, sampler, first_loss, final_loss, steps_per_s,
    resumed_from_step, samples_path (samples [N, S, S, 1] in [-1, 1] and their requested labels, or -1 when
    unconditional).

  Raises:
    ValueError: the data set is not grey 10-class digits.
  """
  os.makedirs(workdir, exist_ok=True)
  ds = data_lib.load_dataset(config.data.name, config.data.get("data_dir") or None)
  if ds.input_shape[-1] != 1 or ds.num_classes != 10:
    raise ValueError("the diffusion check expects grey digits with 10 classes (data.name='digits' or 'mnist5k').")
  size = int(config.data.image_size)
  x_train = digits_images(ds.train, size)
  num_classes = int(config.model.get("num_classes", 0))
  model = unet.create_model(config.model)
  schedule = schedules.from_config(config.schedule)
  tx = make_optimizer(config.optimizer, config.num_steps)
  d = config.diffusion
  ema = float(d.get("ema_decay", 0.0)) > 0
  example = {"class_labels": jnp.zeros((1,), jnp.int32)} if num_classes else {}
  init_fn = functools.partial(train.init, model=model, x_shape=x_train.shape[1:], tx=tx, ema=ema, **example)
  step = train.make_train_step(model, schedule, prediction=d.prediction, weighting=d.weighting,
                                  min_snr_gamma=float(d.min_snr_gamma), cond_drop_prob=float(d.cond_drop_prob),
                                  ema_decay=float(d.get("ema_decay", 0.0)))
  arrays = {"x": x_train, "y": ds.train.y} if num_classes else {"x": x_train}
  stream = data_lib.BatchStream(arrays, config.batch_size, seed=config.seed)
  mesh = sharding.make_mesh(config.get("mesh"))
  res = loop_lib.train_loop(init_fn=init_fn, train_step=step, batches=stream, num_steps=config.num_steps,
                            key=jax.random.key(config.seed), workdir=workdir, mesh=mesh,
                            log_every=config.log_every, config=config, name="diffusion",
                            **loop_lib.checkpoint_options(config))
  params = res.state.extra["ema_params"] if ema else res.state.params
  params = jax.device_put(params, jax.devices()[0])

  # Samples: labels 0..9 cycled (conditional) or none.
  n = int(config.sampler.num_samples)
  labels = np.arange(n) % 10
  sample_fn = make_sample_fn(model, schedule, config, num_classes)
  samples = np.asarray(sample_fn(params, jax.random.key(config.seed + 1), jnp.asarray(labels, jnp.int32),
                                 (n,) + x_train.shape[1:]))
  if not np.all(np.isfinite(samples)):
    raise FloatingPointError("the sampler produced NaN/inf; lower the learning rate or check the schedule.")

  samples_path = os.path.join(workdir, "samples.npz")
  if jax.process_index() == 0:
    np.savez(samples_path, samples=samples, labels=labels if num_classes else np.full(n, -1))
  losses = [r["train/loss"] for r in res.history if "train/loss" in r]
  results = {"num_steps": config.num_steps, "image_size": size, "schedule": schedule.name,
             "prediction": d.prediction, "sampler": dict(config.sampler),
             "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
             "steps_per_s": res.steps_per_s, "resumed_from_step": res.start_step, "samples_path": samples_path}
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0:
    order = np.argsort(labels, kind="stable")[:100] if num_classes else np.arange(min(n, 100))
    grid = (samples[order] + 1.0) / 2.0
    metrics_lib.plot_image_grid(grid, os.path.join(workdir, "samples.png"), ncols=10,
                                title=f"{config.sampler.method} samples ({size}x{size})"
                                + (", rows = requested digit" if num_classes else ""))
    metrics_lib.plot_image_grid((x_train[:len(order)] + 1.0) / 2.0, os.path.join(workdir, "data.png"), ncols=10,
                                title=f"training digits ({size}x{size})")
    rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    metrics_lib.plot_curves(rows, ["train/loss"], os.path.join(workdir, "loss.png"), title="denoising loss")
  return results

# -------------------------------------------------------------------------------------- benchmark
