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

from iclr24_jax.common import checks

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.vision.models import create_model


def init(key: jax.Array, model: nn.Module, input_shape: tuple[int, ...], tx: optax.GradientTransformation
         ) -> TrainState:
  """Initialises params (and batch statistics, if the model has them) -> TrainState.

  Args:
    key: init key.
    model: a Linen classifier.
    input_shape: one example's shape, e.g. (8, 8, 1).
    tx: the optimizer.

  Returns:
    TrainState (step 0; extra = {'batch_stats': ...} when the model has batch statistics, else {}).
  """
  variables = model.init({"params": key}, jnp.zeros((1,) + tuple(input_shape), jnp.float32), train=False)
  params = variables["params"]
  extra = {"batch_stats": variables["batch_stats"]} if "batch_stats" in variables else {}
  return TrainState.create(params, tx, extra=extra)



def apply_model(model: nn.Module, params: Any, extra: Any, x: jax.Array, train: bool, key: jax.Array | None = None,
                return_features: bool = False):
  """Runs the model; returns (outputs, new_extra). Handles batch statistics and dropout rngs.

  Args:
    model: a Linen classifier taking (x, train=, return_features=).
    params: its parameters.
    extra: TrainState.extra ({'batch_stats': ...} for models with batch norm, else {}).
    x: [B, H, W, C] (or [B, ...]) float32 inputs.
    train: training mode (dropout on; batch statistics used and updated).
    key: dropout key (only used when train).
    return_features: also return the penultimate features.

  Returns:
    (logits [B, K], new_extra), or ((logits [B, K], features [B, F]), new_extra) with return_features;
    new_extra carries updated batch statistics only when train.
  """
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
  """Mean softmax cross-entropy of logits [B, K] against integer labels [B].

  Args:
    logits: [B, K] float.
    labels: [B] int in [0, K).
    label_smoothing: optax label-smoothing factor in [0, 1) (0: none).

  Returns:
    scalar float32 mean loss; labels outside [0, K) raise eagerly and give NaN under jit (`common.checks`: a
    one-hot of an out-of-range label is all zeros, which would silently count as a loss of 0).
  """
  where = "vision.cross_entropy"
  k = checks.shapes(where, logits=(logits, "B K"), labels=(labels, "B"))["K"]
  checks.dtype(where, "labels", labels, "integer", "class ids, not one-hot rows.")
  ok = checks.all_ok(checks.indices(where, "labels", labels, k, "class ids in [0, K) for K = logits.shape[-1]."),
                     checks.in_range(where, "label_smoothing", label_smoothing, 0.0, 1.0, high_open=True))
  onehot = jax.nn.one_hot(labels, k)
  if label_smoothing:
    onehot = optax.smooth_labels(onehot, label_smoothing)
  return checks.poison(jnp.mean(optax.softmax_cross_entropy(logits, onehot)), ok)


def loss_fn(params: Any, extra: Any, model: nn.Module, batch: dict, key: jax.Array, label_smoothing: float = 0.0):
  """Cross-entropy loss of a batch {'x': [B, ...], 'y': [B]} -> (loss, (metrics, new_extra)).

  Args:
    params: model parameters (differentiated).
    extra: TrainState.extra (batch statistics).
    model: the Linen classifier.
    batch: {'x': [B, ...] float32, 'y': [B] int32}.
    key: dropout key.
    label_smoothing: see `cross_entropy`.

  Returns:
    (loss scalar, ({'loss', 'accuracy'} scalars, new_extra)).
  """
  logits, new_extra = apply_model(model, params, extra, batch["x"], train=True, key=key)
  loss = cross_entropy(logits, batch["y"], label_smoothing)
  acc = jnp.mean(jnp.argmax(logits, -1) == batch["y"])
  return loss, ({"loss": loss, "accuracy": acc}, new_extra)


def make_train_step(model: nn.Module, label_smoothing: float = 0.0) -> Callable:
  """Returns the pure `train_step(state, batch, key) -> (state, metrics)` for `model`.

  Args:
    model: the Linen classifier.
    label_smoothing: see `cross_entropy`.

  Returns:
    train_step(state, batch {'x': [B, ...], 'y': [B]}, key) -> (new TrainState, {'loss', 'accuracy'});
    it folds state.step into key.
  """

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
  """Accuracy and mean loss of `state` on a split (fixed-shape padded batches; compiled once).

  Args:
    model: the Linen classifier.
    state: TrainState.
    split: Split with x [N, ...], y [N].
    batch_size: rows per batch (rounded up to a multiple of the mesh's data axis).
    mesh: device mesh (None: `sharding.make_mesh()`, all devices).

  Returns:
    {'accuracy': float in [0, 1], 'loss': mean cross-entropy}, over the N real rows.
  """
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


@functools.lru_cache(maxsize=32)   # one jitted function per static value: jit caches by function identity
def _compiled_eval(model: nn.Module, mesh) -> Callable:
  rep = sharding.replicated_sharding(mesh)
  dat = sharding.data_sharding(mesh)
  return jax.jit(make_eval_step(model), in_shardings=(rep, dat, dat), out_shardings=rep)


@functools.lru_cache(maxsize=64)   # one jitted function per static value: jit caches by function identity
def _forward_fn(model: nn.Module, return_features: bool) -> Callable:
  """One jitted eval forward per (model, return_features): repeated `predict` calls reuse its compilations."""
  def fwd(params, extra, xb):
    out, _ = apply_model(model, params, extra, xb, train=False, return_features=return_features)
    return out
  return jax.jit(fwd)


def predict(model: nn.Module, state: TrainState, x: np.ndarray, batch_size: int = 512,
            return_features: bool = False):
  """Logits [N, K] (and features [N, F]) for inputs x [N, ...], on the default device, in batches.

  Args:
    model: the Linen classifier.
    state: TrainState (params, extra).
    x: [N, ...] float32 inputs.
    batch_size: rows per forward call (the last batch is padded).
    return_features: also return the penultimate features.

  Returns:
    numpy logits [N, K], or (logits [N, K], features [N, F]) with return_features.
  """
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
  label_smoothing (optional), mesh (optional).

  Args:
    config: ConfigDict with the fields above.
    dataset: Dataset (x [N, H, W, C] float32, y [N] int32; val is evaluated).
    workdir: folder for metrics / checkpoints (None: nothing written).
    mesh: device mesh (None: from config.mesh).
    progress: print a progress line.
    stop_at: stop after this step without the final save (tests of resumption).

  Returns:
    (model, LoopResult); LoopResult.final_eval holds 'eval/val_accuracy' and 'eval/val_loss'.
  """
  model = create_model(config.model, dataset.num_classes)
  tx = make_optimizer(config.optimizer, config.num_steps)
  stream = data_lib.BatchStream(data_lib.as_batch(dataset.train), config.batch_size, seed=config.seed)
  init_fn = functools.partial(init, model=model, input_shape=dataset.input_shape, tx=tx)
  mesh = sharding.make_mesh(config.get("mesh")) if mesh is None else mesh

  def eval_fn(state):
    return {f"val_{k}": v for k, v in evaluate(model, state, dataset.val, mesh=mesh).items()}

  result = loop_lib.train_loop(
      init_fn=init_fn, train_step=make_train_step(model, float(config.get("label_smoothing", 0.0))),
      batches=stream, num_steps=config.num_steps, key=jax.random.key(config.seed), workdir=workdir, mesh=mesh,
      log_every=config.get("log_every", 100), eval_every=config.get("eval_every", 0), eval_fn=eval_fn,
      config=config, progress=progress, stop_at=stop_at, name="classify", **loop_lib.checkpoint_options(config))
  return model, result
