"""Supervised classification as pure functions: init, loss, train step, eval, and a full run.

Used directly by the `classify` experiment and by papers that need a trained classifier (d2pruning's
training dynamics, coboosting's clients, nci's featurizer, the diffusion digits check).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.vision.models import create_model


def init_state(key: jax.Array, model: nn.Module, input_shape: tuple[int, ...], tx: optax.GradientTransformation
               ) -> TrainState:
  """Initialises params (and batch statistics, if the model has them) -> TrainState.

  Args:
    key: init key.
    model: a Linen classifier.
    input_shape: one example's shape, e.g. (8, 8, 1).
    tx: the optimizer.
  """
  variables = model.init({"params": key}, jnp.zeros((1,) + tuple(input_shape), jnp.float32), train=False)
  params = variables["params"]
  extra = {"batch_stats": variables["batch_stats"]} if "batch_stats" in variables else {}
  return TrainState.create(params, tx, extra=extra)


def apply_model(model: nn.Module, params: Any, extra: Any, x: jax.Array, train: bool, key: jax.Array | None = None,
                return_features: bool = False):
  """Runs the model; returns (outputs, new_extra). Handles batch statistics and dropout rngs."""
  variables = {"params": params}
  has_bs = bool(extra) and "batch_stats" in extra
  if has_bs:
    variables["batch_stats"] = extra["batch_stats"]
  rngs = {"dropout": key} if (train and key is not None) else None
  if has_bs and train:
    out, upd = model.apply(variables, x, train=True, return_features=return_features, rngs=rngs,
                           mutable=["batch_stats"])
    return out, {**extra, "batch_stats": upd["batch_stats"]}
  out = model.apply(variables, x, train=train, return_features=return_features, rngs=rngs)
  return out, extra


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
  """Mean softmax cross-entropy of logits [B, K] against integer labels [B]."""
  k = logits.shape[-1]
  onehot = jax.nn.one_hot(labels, k)
  if label_smoothing:
    onehot = optax.smooth_labels(onehot, label_smoothing)
  return jnp.mean(optax.softmax_cross_entropy(logits, onehot))


def loss_fn(params: Any, extra: Any, model: nn.Module, batch: dict, key: jax.Array, label_smoothing: float = 0.0):
  """Cross-entropy loss of a batch {'x': [B, ...], 'y': [B]} -> (loss, (metrics, new_extra))."""
  logits, new_extra = apply_model(model, params, extra, batch["x"], train=True, key=key)
  loss = cross_entropy(logits, batch["y"], label_smoothing)
  acc = jnp.mean(jnp.argmax(logits, -1) == batch["y"])
  return loss, ({"loss": loss, "accuracy": acc}, new_extra)


def make_train_step(model: nn.Module, label_smoothing: float = 0.0) -> Callable:
  """Returns the pure `train_step(state, batch, key) -> (state, metrics)` for `model`."""

  def train_step(state: TrainState, batch: dict, key: jax.Array):
    key = jax.random.fold_in(key, state.step)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, (metrics, new_extra)), grads = grad_fn(state.params, state.extra, model, batch, key, label_smoothing)
    return state.apply_gradients(grads, extra=new_extra), metrics

  return train_step


def make_eval_step(model: nn.Module) -> Callable:
  """Returns `eval_step(state, batch, mask) -> dict(correct, loss_sum, count)` (sums over valid rows)."""

  def eval_step(state: TrainState, batch: dict, mask: jax.Array):
    logits, _ = apply_model(model, state.params, state.extra, batch["x"], train=False)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
    correct = (jnp.argmax(logits, -1) == batch["y"]) & mask
    return {"correct": jnp.sum(correct), "loss_sum": jnp.sum(jnp.where(mask, ce, 0.0)), "count": jnp.sum(mask)}

  return eval_step


def evaluate(model: nn.Module, state: TrainState, split: data_lib.Split, batch_size: int = 512,
             mesh=None) -> dict[str, float]:
  """Accuracy and mean loss of `state` on a split (fixed-shape padded batches; compiled once)."""
  mesh = sharding.make_mesh() if mesh is None else mesh
  n_data = mesh.shape[sharding.DATA_AXIS]
  step = _compiled_eval(model, mesh)
  tot = {"correct": 0.0, "loss_sum": 0.0, "count": 0.0}
  for batch, mask in data_lib.eval_batches(data_lib.as_batch(split), batch_size, pad_multiple=n_data):
    out = step(state, sharding.shard_batch(batch, mesh), sharding.shard_batch(mask, mesh))
    out = jax.device_get(out)
    for k in tot:
      tot[k] += float(out[k])
  return {"accuracy": tot["correct"] / max(tot["count"], 1), "loss": tot["loss_sum"] / max(tot["count"], 1)}


@functools.lru_cache(maxsize=32)
def _compiled_eval(model: nn.Module, mesh) -> Callable:
  rep = sharding.replicated_sharding(mesh)
  dat = sharding.data_sharding(mesh)
  return jax.jit(make_eval_step(model), in_shardings=(rep, dat, dat), out_shardings=rep)


@functools.lru_cache(maxsize=64)
def _forward_fn(model: nn.Module, return_features: bool) -> Callable:
  """One jitted eval forward per (model, return_features): repeated `predict` calls reuse its compilations."""
  def fwd(params, extra, xb):
    out, _ = apply_model(model, params, extra, xb, train=False, return_features=return_features)
    return out
  return jax.jit(fwd)


def predict(model: nn.Module, state: TrainState, x: np.ndarray, batch_size: int = 512,
            return_features: bool = False):
  """Logits [N, K] (and features [N, F]) for inputs x [N, ...], on the default device, in batches."""
  fwd = _forward_fn(model, return_features)
  outs = []
  n = x.shape[0]
  for batch, mask in data_lib.eval_batches({"x": x}, batch_size):
    outs.append(jax.device_get(fwd(state.params, state.extra, batch["x"])))
  if return_features:
    logits = np.concatenate([o[0] for o in outs])[:n]
    feats = np.concatenate([o[1] for o in outs])[:n]
    return logits, feats
  return np.concatenate(outs)[:n]


def train_classifier(config: Any, dataset: data_lib.Dataset, workdir: str | None = None, mesh=None,
                     progress: bool = True, stop_at: int | None = None):
  """Trains `create_model(config.model)` on `dataset` with the shared loop.

  Config fields: seed, model, optimizer, num_steps, batch_size, log_every, eval_every, checkpoint_every,
  label_smoothing (optional).

  Returns:
    (model, LoopResult); LoopResult.final_eval holds val accuracy/loss.
  """
  model = create_model(config.model, dataset.num_classes)
  tx = make_optimizer(config.optimizer, config.num_steps)
  stream = data_lib.BatchStream(data_lib.as_batch(dataset.train), config.batch_size, seed=config.seed)
  init_fn = functools.partial(init_state, model=model, input_shape=dataset.input_shape, tx=tx)
  mesh = sharding.make_mesh(config.get("mesh")) if mesh is None else mesh

  def eval_fn(state):
    return {f"val_{k}": v for k, v in evaluate(model, state, dataset.val, mesh=mesh).items()}

  result = loop_lib.train_loop(
      init_fn=init_fn, train_step=make_train_step(model, float(config.get("label_smoothing", 0.0))),
      batches=stream, num_steps=config.num_steps, key=jax.random.key(config.seed), workdir=workdir, mesh=mesh,
      log_every=config.get("log_every", 100), eval_every=config.get("eval_every", 0), eval_fn=eval_fn,
      checkpoint_every=config.get("checkpoint_every", 0), config=config, progress=progress, stop_at=stop_at,
      name="classify")
  return model, result
