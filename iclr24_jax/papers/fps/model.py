"""The diffusion prior of the image tasks: an unconditional denoiser (diffusion core) trained on digits, cached.

The paper uses pretrained FFHQ / ImageNet 256x256 ADM models (not available offline). Here the diffusion core's
MLP denoiser (config.model.name = 'mlp'; 'unet' works too) is trained on scikit-learn digits upsampled to
16 x 16 (or MNIST-5k resized), in [-1, 1]. Deviation: an MLP rather than a UNet because DPS differentiates
through the denoiser at every step and, on CPU, conv-net backward passes inside `lax.scan` are 40-80x slower
(see the project notes); the filter itself is indifferent to the architecture.
Trained params are cached under `$ICLR24_JAX_CACHE` (default `~/.cache/iclr24_jax`; `off` disables) / fps / <hash of the model,
schedule, optimizer and data config> / params.msgpack, so reruns reuse them.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from iclr24_jax.common import compile_cache
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.diffusion import schedules, train, unet


def cache_dir() -> str | None:
  """The cache folder for fps artefacts: the project's cache root (`compile_cache.cache_root`) / fps; None when
  `ICLR24_JAX_CACHE=off`."""
  root = compile_cache.cache_root()
  return None if root is None else os.path.join(root, "fps")


def load_images(data_cfg: Any) -> tuple[np.ndarray, np.ndarray]:
  """(train [N, S, S, 1], test [N', S, S, 1]) images in [-1, 1] for data.name 'digits' or 'mnist5k'.

  Args:
    data_cfg: config with name ('digits' | 'mnist5k'), image_size S, data_dir (unused for these two).
  """
  ds = data_lib.load_dataset(data_cfg.name, data_cfg.get("data_dir") or None)
  size = int(data_cfg.image_size)

  def prep(x):
    x = np.asarray(x, np.float32)
    if x.shape[-1] != 1:
      raise ValueError(f"fps image tasks expect grey images, got {x.shape[-1]} channels.")
    if x.shape[1] != size:
      x = np.asarray(jax.image.resize(x, (x.shape[0], size, size, 1), "linear", antialias=True))
    return np.clip(2.0 * x - 1.0, -1.0, 1.0)

  return prep(np.concatenate([ds.train.x, ds.val.x])), prep(ds.test.x)


def model_key(cfg: Any) -> str:
  """A short hash of everything that determines the trained params."""
  blob = json.dumps({"model": cfg.model.to_dict(), "schedule": cfg.schedule.to_dict(),
                     "optimizer": cfg.optimizer.to_dict(), "data": {k: v for k, v in cfg.data.to_dict().items()
                                                                    if k != "data_dir"},
                     "train_steps": int(cfg.train_steps), "batch_size": int(cfg.batch_size),
                     "ema_decay": float(cfg.ema_decay), "seed": int(cfg.seed)}, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def get_prior(cfg: Any, workdir: str | None = None, use_cache: bool = True, progress: bool = False
              ) -> tuple[Any, Any, Any, dict]:
  """Trains (or loads from the cache) the digits diffusion prior.

  Args:
    cfg: the fps config (model, schedule, optimizer, data, train_steps, batch_size, ema_decay, seed, mesh).
    workdir: where the training metrics go (None: nothing written).
    use_cache: read / write the params cache.
    progress: print a progress line while training.

  Returns:
    (model, params (EMA if ema_decay > 0), schedule, info dict: cached, train_steps, final_loss, path).
  """
  model = unet.create_model(ml_collections.ConfigDict({**cfg.model.to_dict(), "num_classes": 0}))
  schedule = schedules.from_config(cfg.schedule)
  x_train, _ = load_images(cfg.data)
  x_shape = x_train.shape[1:]
  tx = make_optimizer(cfg.optimizer, int(cfg.train_steps))
  ema = float(cfg.ema_decay) > 0
  folder = cache_dir()
  use_cache = use_cache and folder is not None
  path = os.path.join(folder, model_key(cfg), "params.msgpack") if use_cache else None
  template = jax.eval_shape(lambda k: train.init(k, model, x_shape, tx, ema=ema), jax.random.key(0))
  params_template = template.extra["ema_params"] if ema else template.params
  if use_cache and os.path.exists(path):
    with open(path, "rb") as f:
      params = flax.serialization.from_bytes(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), params_template),
                                             f.read())
    return model, jax.tree.map(jnp.asarray, params), schedule, {"cached": True, "path": path,
                                                                 "train_steps": int(cfg.train_steps)}
  step = train.make_train_step(model, schedule, prediction="eps", ema_decay=float(cfg.ema_decay))
  stream = data_lib.BatchStream({"x": x_train}, int(cfg.batch_size), seed=int(cfg.seed))
  mesh = sharding.make_mesh(cfg.get("mesh"))
  res = loop_lib.train_loop(
      init_fn=lambda k: train.init(k, model, x_shape, tx, ema=ema), train_step=step, batches=stream,
      num_steps=int(cfg.train_steps), key=jax.random.key(int(cfg.seed)), workdir=workdir, mesh=mesh,
      log_every=int(cfg.log_every), config=cfg, progress=progress, name="fps-prior",
      **loop_lib.checkpoint_options(cfg))
  params = res.state.extra["ema_params"] if ema else res.state.params
  params = jax.device_put(params, jax.devices()[0])
  losses = [r["train/loss"] for r in res.history if "train/loss" in r]
  if use_cache:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + f".tmp{os.getpid()}"
    with open(tmp, "wb") as f:
      f.write(flax.serialization.to_bytes(jax.device_get(params)))
    os.replace(tmp, path)
  return model, params, schedule, {"cached": False, "path": path, "train_steps": int(cfg.train_steps),
                                   "first_loss": losses[0] if losses else None,
                                   "final_loss": losses[-1] if losses else None, "steps_per_s": res.steps_per_s}


def make_denoiser(model, params):
  """denoiser(x_t [B, S, S, 1], t [B]) -> eps [B, S, S, 1] of the trained UNet.

  Args:
    model: the UNet module.
    params: its trained params.

  Returns:
    the denoiser closure (t in the schedule's units).
  """
  return train.make_denoiser(model, params)
