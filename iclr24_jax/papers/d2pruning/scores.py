"""Difficulty scores from training dynamics: forgetting events, EL2N, AUM, gold-probability variance.

A classifier is trained on the full training set; on every minibatch the training forward pass (the
logits the update is computed from, as the official `Trainer` logs them) gives, per example and epoch:
gold-label probability, correctness, margin and the EL2N norm. From these (official
generate_importance_score.py, `training_dynamics_metrics` and `EL2N`):

  forgetting  number of epochs where a correctly classified example becomes misclassified (Toneva et
              al.); counting starts from 'not yet correct', so never-learned examples score 0 (the
              official code; Toneva et al. give them the maximum).             higher = harder
  aum         accumulated margin: sum over epochs of p_gold - max_{c != y} p_c (probability margins, as
              the official code; Pleiss et al. use logit margins averaged).     lower = harder
  el2n        sum over the first `el2n_epochs` (10) epochs of ||softmax - onehot||_2 (Paul et al. use
              one early epoch averaged over seeds; any positive scale leaves D2 and CCS unchanged).
                                                                               higher = harder
  variance    variance over epochs of p_gold (dataset-cartography variability, Swayamdipta et al.).
                                                                               higher = harder
The official D2 command (README, CIFAR-10) uses forgetting as the difficulty and AUM for the hard cutoff.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.vision import classify

__all__ = ["example_stats", "make_train_step", "make_dynamics_trainer", "scores_from_dynamics", "as_difficulty",
           "SCORE_NAMES"]

SCORE_NAMES = ("forgetting", "el2n", "aum", "variance")


def example_stats(logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
  """Per-example training-dynamics statistics of one forward pass.

  Args:
    logits: [B, K]; labels: [B] int.

  Returns:
    dict of [B] arrays: p_gold, correct (bool), margin (p_gold - largest other probability),
    el2n (||softmax - onehot||_2).
  """
  p = jax.nn.softmax(logits.astype(jnp.float32), -1)
  onehot = jax.nn.one_hot(labels, p.shape[-1], dtype=p.dtype)
  p_gold = jnp.sum(p * onehot, -1)
  other = jnp.max(jnp.where(onehot > 0, -jnp.inf, p), -1)
  return {"p_gold": p_gold, "correct": jnp.argmax(p, -1) == labels, "margin": p_gold - other,
          "el2n": jnp.sqrt(jnp.sum(jnp.square(p - onehot), -1))}


def make_train_step(model: nn.Module) -> Callable:
  """`train_step(state, batch, key) -> (state, metrics, stats)`; batch = {'x', 'y', 'mask' [B] float}.

  The loss is the cross-entropy averaged over valid rows (mask), `stats` are `example_stats` of the
  logits the gradient was taken at (before the update).
  """

  def train_step(state: TrainState, batch: dict, key: jax.Array):
    key = jax.random.fold_in(key, state.step)
    mask = batch["mask"].astype(jnp.float32)

    def loss_fn(params):
      logits, new_extra = classify.apply_model(model, params, state.extra, batch["x"], train=True, key=key)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
      return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0), (logits, new_extra)

    (loss, (logits, new_extra)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    stats = example_stats(logits, batch["y"])
    acc = jnp.sum(stats["correct"] * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return state.apply_gradients(grads, extra=new_extra), {"loss": loss, "accuracy": acc}, stats

  return train_step


def make_dynamics_trainer(model: nn.Module, tx: optax.GradientTransformation, input_shape: tuple[int, ...],
                          num_epochs: int, batch_size: int) -> Callable:
  """Returns the pure `train(key, x, y) -> (state, dynamics, metrics)` (compile it with jax.jit).

  Each epoch visits every example once in a fresh random order (the last batch is padded and masked,
  like a DataLoader's short last batch); epochs and batches are `lax.scan`s, so the whole run is one
  compiled program (not `common.loop.train_loop`: the per-example, per-epoch dynamics are outputs of the
  scan, not metrics logged between steps). `make_dynamics_chunks` is the same run in resumable chunks of epochs.

  Args:
    model: a Linen classifier (`iclr24_jax.vision.create_model`).
    tx: optimizer.
    input_shape: one example's shape.
    num_epochs, batch_size: training length.

  Returns:
    train(key, x [N, ...], y [N]) -> (final TrainState, dynamics: dict of [E, N] arrays p_gold,
    correct, margin, el2n; metrics: dict of [E] epoch means loss, accuracy).
  """
  init, epochs = make_dynamics_chunks(model, tx, input_shape, num_epochs, batch_size)

  def train(key: jax.Array, x: jax.Array, y: jax.Array):
    carry = epochs(init(key, x.shape[0]), key, x, y, 0, num_epochs)
    return carry["state"], carry["dynamics"], carry["curves"]

  return train


def make_dynamics_chunks(model: nn.Module, tx: optax.GradientTransformation, input_shape: tuple[int, ...],
                         num_epochs: int, batch_size: int) -> tuple[Callable, Callable]:
  """`make_dynamics_trainer` cut into resumable chunks of epochs (pure; compile `epochs` with n static).

  Epoch e draws its order from `jax.random.split(key_order, num_epochs)[e]`, so chunks [0, a) then [a, E) run
  the scan of one uninterrupted run.

  Args:
    model, tx, input_shape, num_epochs, batch_size: as `make_dynamics_trainer`'s.

  Returns:
    (init(key, n) -> carry, epochs(carry, key, x [N, ...], y [N], start, n) -> carry): the carry holds 'state'
    (TrainState), 'dynamics' (dict of [E, N] p_gold, correct, margin, el2n; epochs not run yet are zero) and
    'curves' (dict of [E] loss, accuracy); `epochs` runs epochs start .. start + n - 1 (start traced, n static).
  """
  step = make_train_step(model)

  def init(key: jax.Array, n: int) -> dict:
    state = classify.init(jax.random.split(key, 3)[0], model, input_shape, tx)
    dynamics = {"p_gold": jnp.zeros((num_epochs, n)), "correct": jnp.zeros((num_epochs, n), bool),
                "margin": jnp.zeros((num_epochs, n)), "el2n": jnp.zeros((num_epochs, n))}
    return {"state": state, "dynamics": dynamics,
            "curves": {"loss": jnp.zeros(num_epochs), "accuracy": jnp.zeros(num_epochs)}}

  def epochs(carry: dict, key: jax.Array, x: jax.Array, y: jax.Array, start: jax.Array, n: int) -> dict:
    num = x.shape[0]
    steps = -(-num // batch_size)
    _, key_order, key_train = jax.random.split(key, 3)
    keys = jax.lax.dynamic_slice_in_dim(jax.random.split(key_order, num_epochs), start, n)

    def epoch(state, key_e):
      perm = jax.random.permutation(key_e, num)
      order = jnp.pad(perm, (0, steps * batch_size - num), constant_values=num).reshape(steps, batch_size)

      def one_batch(carry, idx):
        state, stats_acc = carry
        safe = jnp.minimum(idx, num - 1)
        batch = {"x": x[safe], "y": y[safe], "mask": idx < num}
        state, metrics, stats = step(state, batch, key_train)
        stats_acc = {k: v.at[idx].set(stats[k].astype(v.dtype), mode="drop") for k, v in stats_acc.items()}
        return (state, stats_acc), metrics

      zero = {"p_gold": jnp.zeros(num), "correct": jnp.zeros(num, bool), "margin": jnp.zeros(num),
              "el2n": jnp.zeros(num)}
      (state, stats), metrics = jax.lax.scan(one_batch, (state, zero), order)
      return state, (stats, jax.tree_util.tree_map(jnp.mean, metrics))

    state, (dyn, curves) = jax.lax.scan(epoch, carry["state"], keys)
    put = lambda full, part: jax.lax.dynamic_update_slice_in_dim(full, part.astype(full.dtype), start, 0)
    return {"state": state, "dynamics": jax.tree_util.tree_map(put, carry["dynamics"], dyn),
            "curves": {k: put(carry["curves"][k], curves[k]) for k in carry["curves"]}}

  return init, epochs


def scores_from_dynamics(dynamics: dict[str, Any], el2n_epochs: int = 10) -> dict[str, np.ndarray]:
  """Difficulty scores from per-epoch statistics.

  Args:
    dynamics: dict of [E, N] arrays p_gold, correct, margin, el2n (from `make_dynamics_trainer`).
    el2n_epochs: EL2N sums the first this-many epochs (official max_epoch=10).

  Returns:
    dict of [N] float arrays: forgetting, aum, el2n, variance (see the module docstring), plus
    correctness (epochs correct) and confidence (mean p_gold).
  """
  correct = np.asarray(dynamics["correct"]).astype(bool)
  p_gold = np.asarray(dynamics["p_gold"], np.float64)
  if correct.ndim != 2:
    raise ValueError(f"dynamics arrays must be [epochs, N]; got {correct.shape}.")
  forgot = correct[:-1] & ~correct[1:]  # learned at epoch e-1, forgotten at epoch e
  return {
      "forgetting": forgot.sum(0).astype(np.float64),
      "aum": np.asarray(dynamics["margin"], np.float64).sum(0),
      "el2n": np.asarray(dynamics["el2n"], np.float64)[:el2n_epochs].sum(0),
      "variance": p_gold.var(0),
      "correctness": correct.sum(0).astype(np.float64),
      "confidence": p_gold.mean(0),
  }


def as_difficulty(scores: dict[str, np.ndarray], name: str) -> np.ndarray:
  """A score oriented so that higher = harder and >= 0 ('aum' becomes max(aum) - aum)."""
  if name not in scores:
    raise ValueError(f"unknown score '{name}'; choose one of {sorted(scores)}.")
  s = np.asarray(scores[name], np.float64)
  if name == "aum":
    return s.max() - s
  if name in ("confidence", "correctness"):
    return s.max() - s
  return s
