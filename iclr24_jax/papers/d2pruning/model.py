"""Classifiers for D2 Pruning: the score model (training dynamics + embeddings) and coreset training.

The paper trains ResNet-18 on CIFAR both to get training dynamics / embeddings and to evaluate the
coresets; here the foundation's small classifiers (`iclr24_jax.vision.create_model`: MLP / CNN) play
both roles on digits and MNIST-5k. Coreset evaluation trains many models at once: every (method,
pruning rate, seed) run is one slice of a `jax.vmap`ped training loop over padded index sets, so a
whole reproduction compiles once per data set.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.vision import classify
from iclr24_jax.vision.models import create_model

__all__ = ["create_classifier", "make_coreset_trainer", "make_batched_eval", "pad_coresets", "embed"]


def create_classifier(config: Any, num_classes: int, num_steps: int) -> tuple[nn.Module, optax.GradientTransformation]:
  """(model, optimizer) from `config.model` / `config.optimizer` for `num_steps` updates."""
  return create_model(config.model, num_classes), make_optimizer(config.optimizer, num_steps)


def pad_coresets(coresets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Stacks index sets of different sizes -> (indices [R, M_max] int32 padded with 0, sizes [R] int32)."""
  sizes = np.asarray([len(c) for c in coresets], np.int32)
  if (sizes <= 0).any():
    raise ValueError("every coreset must hold at least one example.")
  out = np.zeros((len(coresets), int(sizes.max())), np.int32)
  for i, c in enumerate(coresets):
    out[i, :len(c)] = np.asarray(c, np.int32)
  return out, sizes


def make_coreset_trainer(model: nn.Module, tx: optax.GradientTransformation, input_shape: tuple[int, ...],
                         num_steps: int, batch_size: int) -> Callable:
  """Returns the pure `train_many(keys [R], x, y, coresets [R, M], sizes [R]) -> TrainState` (batched).

  Run r trains a fresh model (init from keys[r]) for `num_steps` steps on minibatches drawn uniformly
  with replacement from coresets[r, :sizes[r]] (Deviation: the official trainer reshuffles per epoch;
  with a fixed number of steps the two differ only in sampling noise). The number of steps is the same
  for every coreset size, as in the official (and CCS) protocol of training coresets for the same number
  of iterations as the full data.

  Not `common.loop.train_loop`: that loop drives one state from host batches; here R independent runs are
  one `vmap` of a `lax.scan` over steps (one compiled program for ~100 runs, sharded over devices by run);
  `make_coreset_chunks` cuts it into chunks that `experiment.train_coresets` checkpoints between.
  """
  init_many, steps_many = make_coreset_chunks(model, tx, input_shape, batch_size)

  def train_many(keys, x, y, coresets, sizes):
    return steps_many(init_many(keys), keys, x, y, coresets, sizes, 0, num_steps)

  return train_many


def make_coreset_chunks(model: nn.Module, tx: optax.GradientTransformation, input_shape: tuple[int, ...],
                        batch_size: int) -> tuple[Callable, Callable]:
  """`make_coreset_trainer` cut into resumable chunks of steps (pure; compile `steps_many` with n static).

  Step t of run r draws its batch from `fold_in(key_batch_r, t)`, so chunks [0, a) then [a, T) run the steps of
  one uninterrupted scan.

  Args:
    model, tx, input_shape, batch_size: as `make_coreset_trainer`'s.

  Returns:
    (init_many(keys [R]) -> TrainState [R], steps_many(states [R], keys [R], x, y, coresets [R, M], sizes [R],
    start, n) -> (states [R], losses [R, n])): steps start .. start + n - 1 of every run (start traced, n static).
  """
  step = classify.make_train_step(model)

  def init_one(key):
    return classify.init(jax.random.split(key, 3)[0], model, input_shape, tx)

  def steps_one(state, key, x, y, coreset, size, start, n):
    _, key_batch, key_train = jax.random.split(key, 3)

    def body(state, t):
      u = jax.random.uniform(jax.random.fold_in(key_batch, t), (batch_size,))
      idx = coreset[jnp.minimum((u * size).astype(jnp.int32), size - 1)]
      state, metrics = step(state, {"x": x[idx], "y": y[idx]}, key_train)
      return state, metrics["loss"]

    return jax.lax.scan(body, state, start + jnp.arange(n))

  def init_many(keys):
    return jax.vmap(init_one)(keys)

  def steps_many(states, keys, x, y, coresets, sizes, start, n):
    one = lambda st, k, c, sz: steps_one(st, k, x, y, c, sz, start, n)
    return jax.vmap(one)(states, keys, coresets, sizes)

  return init_many, steps_many


def make_batched_eval(model: nn.Module) -> Callable:
  """`accuracy(states, x, y) -> [R]` test accuracy of each of R stacked models (pure)."""

  def acc_one(state, x, y):
    logits, _ = classify.apply_model(model, state.params, state.extra, x, train=False)
    return jnp.mean(jnp.argmax(logits, -1) == y)

  def accuracy(states, x, y):
    return jax.vmap(acc_one, in_axes=(0, None, None))(states, x, y)

  return accuracy


def embed(model: nn.Module, state, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(logits [N, K], penultimate features [N, F]) of a trained classifier (the D2 graph embeddings)."""
  logits, feats = classify.predict(model, state, np.asarray(x), return_features=True)
  return np.asarray(logits), np.asarray(feats, np.float32)
