"""Losses, the pure train step, prediction, evaluation and a small fit loop for GraphCare models.

A batch (graphs.Batcher) is a dict of arrays with a leading shard axis [S, ...]: graph (GraphsTuple),
visit_node [S, N, V], pairs [S, P, 2], codes [S, G, V, K], valid [S, G], label [S, G] (binary: {0, 1};
multiclass: int) or [S, G, L] (multilabel). The model runs on each shard under `jax.vmap`, so sharding
the S axis over the mesh's 'data' axis is plain data parallelism and the numbers do not depend on the
number of devices.

Losses (official graphcare.py): binary and multilabel -> binary cross-entropy with logits (mean over
patients and labels), multiclass -> softmax cross-entropy; means over real patients only.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import sharding
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.graphcare import metrics as metrics_lib


def _shard_apply(model: nn.Module, params: Any, shard: dict, train: bool, key: jax.Array | None,
                 return_attention: bool = False):
  rngs = {"dropout": key} if (train and key is not None) else None
  return model.apply({"params": params}, shard["graph"], shard["visit_node"], shard["codes"], shard.get("pairs"),
                     train=train, rngs=rngs, return_attention=return_attention)


def apply_batch(model: nn.Module, params: Any, batch: dict, train: bool = False, key: jax.Array | None = None
                ) -> jax.Array:
  """Logits of every shard: [S, G, out_dim] (vmap over the shard axis; per-shard dropout keys)."""
  s = batch["valid"].shape[0]
  keys = jax.random.split(key, s) if key is not None else None
  if keys is None:
    return jax.vmap(lambda sh: _shard_apply(model, params, sh, train, None))(batch)
  return jax.vmap(lambda sh, k: _shard_apply(model, params, sh, train, k))(batch, keys)


def task_loss(logits: jax.Array, labels: jax.Array, mask: jax.Array, task: str) -> jax.Array:
  """Mean loss over real patients.

  Args:
    logits: [..., G, out_dim].
    labels: [..., G] (binary / multiclass) or [..., G, L] (multilabel).
    mask: [..., G] bool, real patients.
    task: 'binary' | 'multiclass' | 'multilabel'.

  Returns:
    scalar: binary -> BCE(logits[..., 0], y); multilabel -> BCE averaged over labels; multiclass -> CE.
  """
  if task == "binary":
    per = optax.sigmoid_binary_cross_entropy(logits[..., 0], labels.astype(jnp.float32))
  elif task == "multilabel":
    per = optax.sigmoid_binary_cross_entropy(logits, labels.astype(jnp.float32)).mean(-1)
  elif task == "multiclass":
    per = optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32))
  else:
    raise ValueError(f"unknown task '{task}'; choose one of {metrics_lib.TASKS}.")
  m = mask.astype(per.dtype)
  return jnp.sum(per * m) / jnp.maximum(jnp.sum(m), 1.0)


def probabilities(logits: jax.Array, task: str) -> jax.Array:
  """sigmoid (binary -> [..., G], multilabel) or softmax (multiclass) of the logits."""
  if task == "binary":
    return jax.nn.sigmoid(logits[..., 0])
  if task == "multilabel":
    return jax.nn.sigmoid(logits)
  return jax.nn.softmax(logits, axis=-1)


def loss_fn(params: Any, batch: dict, key: jax.Array, *, model: nn.Module, task: str, train: bool = True
            ) -> tuple[jax.Array, dict]:
  """Loss of a batch -> (loss, metrics dict(loss, num_patients))."""
  logits = apply_batch(model, params, batch, train=train, key=key)
  loss = task_loss(logits, batch["label"], batch["valid"], task)
  return loss, {"loss": loss, "num_patients": jnp.sum(batch["valid"])}


def train_step(state: TrainState, batch: dict, key: jax.Array, *, model: nn.Module, task: str
               ) -> tuple[TrainState, dict]:
  """One optimizer step (pure; callers jit it). Folds state.step into the key for dropout.

  Args:
    state: TrainState (params, opt_state, step).
    batch: a Batcher batch ([S, ...] leaves).
    key: the run's training key.
    model: a BAT / EHRGRU module.
    task: 'binary' | 'multiclass' | 'multilabel'.

  Returns:
    (new state, metrics dict(loss, num_patients, grad_norm)).
  """
  key = jax.random.fold_in(key, state.step)
  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, key, model=model, task=task)
  metrics = dict(metrics, grad_norm=optax.global_norm(grads))
  return state.apply_gradients(grads), metrics


def make_train_step(model: nn.Module, task: str) -> Callable:
  """`train_step` with the model and task bound: (state, batch, key) -> (state, metrics)."""
  return functools.partial(train_step, model=model, task=task)


def predict_step(params: Any, batch: dict, *, model: nn.Module, task: str) -> dict:
  """Eval-mode probabilities [S, G, ...] and the valid mask [S, G]."""
  logits = apply_batch(model, params, batch, train=False)
  return {"prob": probabilities(logits, task), "valid": batch["valid"], "loss":
          task_loss(logits, batch["label"], batch["valid"], task)}


def init_state(key: jax.Array, model: nn.Module, sample_batch: dict, tx: optax.GradientTransformation,
               node_embedding: np.ndarray | None = None, relation_embedding: np.ndarray | None = None
               ) -> TrainState:
  """Initialises params on one shard of `sample_batch`; node / relation tables start from the KG's
  (clustered) name embeddings when given (official: nn.Embedding.from_pretrained, trainable).

  Args:
    key: init key.
    model: the module.
    sample_batch: a batch ([S, ...]); shard 0 is used for shapes.
    tx: optimizer.
    node_embedding: [M, D] initial node embeddings.
    relation_embedding: [R, D] initial relation embeddings.

  Returns:
    TrainState.
  """
  shard = jax.tree.map(lambda x: jnp.asarray(x[0]), sample_batch)
  params = model.init({"params": key}, shard["graph"], shard["visit_node"], shard["codes"], shard.get("pairs"),
                      train=False)["params"]
  params = dict(params)
  if node_embedding is not None and "node_emb" in params:
    want = params["node_emb"]["embedding"].shape
    if tuple(node_embedding.shape) != tuple(want):
      raise ValueError(f"init_state: node_embedding has shape {node_embedding.shape}, the model wants {want}.")
    params["node_emb"] = {"embedding": jnp.asarray(node_embedding, jnp.float32)}
  if relation_embedding is not None and "rel_emb" in params:
    want = params["rel_emb"]["embedding"].shape
    if tuple(relation_embedding.shape) != tuple(want):
      raise ValueError(f"init_state: relation_embedding has shape {relation_embedding.shape}, the model wants {want}.")
    params["rel_emb"] = {"embedding": jnp.asarray(relation_embedding, jnp.float32)}
  return TrainState.create(params, tx)


def compiled_predict(model: nn.Module, task: str, mesh=None) -> Callable:
  """jit(predict_step) over the mesh (params replicated, batch sharded on its shard axis)."""
  mesh = sharding.make_mesh() if mesh is None else mesh
  return _compiled_predict(model, task, mesh)


@functools.lru_cache(maxsize=64)
def _compiled_predict(model: nn.Module, task: str, mesh) -> Callable:
  rep, dat = sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)
  return jax.jit(functools.partial(predict_step, model=model, task=task), in_shardings=(rep, dat),
                 out_shardings=rep)


def collect_predictions(model: nn.Module, params: Any, batches: Iterable[dict], task: str, mesh=None
                        ) -> tuple[np.ndarray, np.ndarray, float]:
  """Runs the compiled predictor over batches; returns (y_true, y_prob, mean loss) of the real patients."""
  mesh = sharding.make_mesh() if mesh is None else mesh
  fn = compiled_predict(model, task, mesh)
  ys, ps, losses, counts = [], [], [], []
  for batch in batches:
    out = jax.device_get(fn(params, sharding.shard_batch(batch, mesh)))
    valid = np.asarray(batch["valid"]).astype(bool)
    ys.append(np.asarray(batch["label"])[valid])
    ps.append(np.asarray(out["prob"])[valid])
    losses.append(float(out["loss"]) * valid.sum()), counts.append(valid.sum())
  y_true = np.concatenate(ys) if ys else np.zeros((0,))
  y_prob = np.concatenate(ps) if ps else np.zeros((0,))
  if not np.all(np.isfinite(y_prob)):
    raise FloatingPointError("the model produced NaN/inf probabilities (diverged training?); lower "
                             "config.optimizer.learning_rate or set optimizer.grad_clip.")
  return y_true, y_prob, float(np.sum(losses) / max(np.sum(counts), 1))


def evaluate(model: nn.Module, params: Any, batches: Iterable[dict], task: str, mesh=None) -> dict[str, float]:
  """Task metrics of `params` on batches (graphs.Batcher.eval_batches).

  Args:
    model: the module.
    params: its parameters (a TrainState's .params).
    batches: eval batches (filler graphs are ignored through `valid`).
    task: 'binary' | 'multiclass' | 'multilabel'.
    mesh: device mesh (default: all devices).

  Returns:
    binary: dict(auroc, auprc, f1, f1_macro, jaccard, accuracy, loss, num_patients); multiclass:
    dict(accuracy, f1_macro, f1_weighted, kappa, auroc, ...); multilabel: dict(jaccard, f1, auprc, auroc, ...).
  """
  y_true, y_prob, loss = collect_predictions(model, params, batches, task, mesh)
  out = metrics_lib.task_metrics(task, y_true, y_prob)
  out.update(loss=loss, num_patients=int(len(y_true)))
  return out


def fit(model: nn.Module, task: str, tx: optax.GradientTransformation, sample_batch: dict,
        train_batches: Callable[[int], dict], num_steps: int, key: jax.Array, mesh=None,
        node_embedding: np.ndarray | None = None, relation_embedding: np.ndarray | None = None,
        eval_fn: Callable[[Any], float] | None = None, eval_every: int = 0, step_fn: Callable | None = None
        ) -> tuple[TrainState, list[dict]]:
  """A compact training loop for reproductions (no files): train, optionally keep the best-by-eval params.

  As the official loop, which keeps the weights of the best validation AUROC epoch.

  Args:
    model, task, tx: what to train.
    sample_batch: any batch (for init shapes).
    train_batches: step -> batch.
    num_steps: optimizer steps.
    key: run key (split into init / train keys).
    mesh: device mesh (default: all devices).
    node_embedding, relation_embedding: initial tables.
    eval_fn: params -> score (higher is better); the best params are returned.
    eval_every: evaluate every N steps (and at the end).
    step_fn: a compiled step to reuse (from `common.loop.compile_step(make_train_step(...), mesh)`).

  Returns:
    (state with the best (or last) params, history rows {step, loss[, score]}).
  """
  from iclr24_jax.common.loop import compile_step
  mesh = sharding.make_mesh() if mesh is None else mesh
  key_init, key_train = jax.random.split(key)
  rep = sharding.replicated_sharding(mesh)
  with jax.set_mesh(mesh):
    state = init_state(key_init, model, sample_batch, tx, node_embedding, relation_embedding)
    state = jax.device_put(state, rep)
    step = step_fn if step_fn is not None else compile_step(make_train_step(model, task), mesh)
    history, pending = [], []
    best, best_params = -np.inf, None
    for i in range(num_steps):
      state, m = step(state, sharding.shard_batch(train_batches(i), mesh), key_train)
      pending.append(m["loss"])
      last = i + 1 == num_steps
      if eval_fn is not None and eval_every and ((i + 1) % eval_every == 0 or last):
        score = float(eval_fn(state.params))
        history.append({"step": i + 1, "loss": float(np.mean(jax.device_get(pending))), "score": score})
        pending = []
        if np.isfinite(score) and score > best:
          best, best_params = score, jax.tree.map(lambda x: x.copy(), state.params)
      elif (i + 1) % 50 == 0 or last:
        history.append({"step": i + 1, "loss": float(np.mean(jax.device_get(pending)))})
        pending = []
    if best_params is not None:
      state = state.replace(params=best_params)
  return state, history
