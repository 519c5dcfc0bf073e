"""Full-graph training of PMP and the baselines: init, loss, train step, prediction, and a whole fit.

One step = one full-batch gradient on all training nodes (official: mini-batches of 128-512 target nodes with
their full neighbourhoods; the expected gradient is the same). The model with the best validation metric is
kept (official: early stopping on validation AUC and reloading the best checkpoint), its fraud threshold is
tuned on the validation nodes (best fraud-class F1, official `best_pr_thres`) and applied to the test nodes.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.pmp import data as data_lib
from iclr24_jax.papers.pmp import metrics as metrics_lib
from iclr24_jax.papers.pmp.model import RelationalGNN, create_model

SCORE_FNS = ("softmax", "sigmoid_logit")


def _dummy_graphs(num_relations: int) -> list:
  s = jnp.array([0, 1], jnp.int32)
  return [graph_lib.GraphsTuple(nodes=None, edges=None, senders=s, receivers=s[::-1], n_node=None, n_edge=None,
                                globals=None) for _ in range(num_relations)]


def init_params(key: jax.Array, model: RelationalGNN, num_relations: int, feature_dim: int) -> Any:
  """Model parameters; shapes depend only on (R, F, model widths), so a 2-node dummy graph is enough.

  Args:
    key: init key; model: PMP / GraphSAGE / GCN; num_relations: R; feature_dim: F.

  Returns:
    The params pytree.
  """
  x = jnp.zeros((2, feature_dim), jnp.float32)
  ls = jnp.full((2,), model.num_classes, jnp.int32)
  return model.init({"params": key}, _dummy_graphs(num_relations), x, ls, train=False)["params"]


def init(key: jax.Array, model: RelationalGNN, num_relations: int, feature_dim: int,
         tx: optax.GradientTransformation) -> TrainState:
  """TrainState at step 0 (see init_params).

  Args:
    key: init key; model: PMP / GraphSAGE / GCN; num_relations: R; feature_dim: F; tx: the optimizer.

  Returns:
    TrainState (step 0, the params of `init_params`).
  """
  return TrainState.create(init_params(key, model, num_relations, feature_dim), tx)



def loss_fn(params: Any, model: RelationalGNN, batch: dict, key: jax.Array | None, train: bool = True,
            weighted_loss: bool = False) -> tuple[jax.Array, dict]:
  """Cross-entropy over the training nodes of a full-graph batch (official nn.CrossEntropyLoss, mean).

  Args:
    params: model params.
    model: the module.
    batch: make_batch output (x [N, F], labels [N], label_state [N], train_mask [N], relations).
    key: dropout key (None or train=False: no dropout).
    train: dropout on.
    weighted_loss: official option (off in all configs): weight fraud by #benign / #fraud training nodes.

  Returns:
    (loss, metrics dict with loss and train accuracy).
  """
  graphs = data_lib.batch_graphs(batch)
  rngs = {"dropout": key} if (train and key is not None) else None
  logits = model.apply({"params": params}, graphs, batch["x"], batch["label_state"], train=train, rngs=rngs)
  labels = batch["labels"]
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)          # [N]
  w = batch["train_mask"].astype(jnp.float32)
  if weighted_loss:
    n_pos = jnp.sum(w * (labels == 1))
    n_neg = jnp.sum(w * (labels == 0))
    w = w * jnp.where(labels == 1, n_neg / jnp.maximum(n_pos, 1.0), 1.0)
  loss = jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)
  acc = jnp.sum((jnp.argmax(logits, -1) == labels) * batch["train_mask"]) / jnp.maximum(jnp.sum(batch["train_mask"]), 1.0)
  return loss, {"loss": loss, "accuracy": acc}


@functools.lru_cache(maxsize=32)   # one step closure per model: its compilation is reused
def make_train_step(model: RelationalGNN, weighted_loss: bool = False) -> Callable:
  """Returns the pure `train_step(state, batch, key) -> (state, metrics)` (cached per model, so a compiled
  step is reused across seeds)."""

  def train_step(state: TrainState, batch: dict, key: jax.Array):
    key = jax.random.fold_in(key, state.step)
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, model, batch, key, True,
                                                                    weighted_loss)
    return state.apply_gradients(grads), metrics

  return train_step


@functools.lru_cache(maxsize=32)   # one jitted function per static value: jit caches by function identity
def make_predict(model: RelationalGNN) -> Callable:
  """Jitted `predict(params, batch) -> logits [N, C]` (no dropout)."""

  def predict(params, batch):
    return model.apply({"params": params}, data_lib.batch_graphs(batch), batch["x"], batch["label_state"],
                       train=False)

  return jax.jit(predict)


def class_scores(logits: np.ndarray | jax.Array, score_fn: str = "softmax") -> np.ndarray:
  """[N, C] class scores from logits: softmax (default), or the official quirk sigmoid(logits) per class
  (`convert_probs` takes sigmoid(logit_1) as the fraud probability)."""
  if score_fn == "softmax":
    return np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
  if score_fn == "sigmoid_logit":
    return np.asarray(jax.nn.sigmoid(jnp.asarray(logits)))
  raise ValueError(f"unknown score_fn '{score_fn}'; choose one of {SCORE_FNS}.")


def split_metrics(probs: np.ndarray, labels: np.ndarray, idx: np.ndarray, num_classes: int,
                  threshold: float = 0.5) -> dict[str, float]:
  """Metrics of one split: binary -> pmp.evaluate (auc, f1_macro, gmean) + accuracy at the threshold;
  multi-class -> macro one-vs-rest auc, macro F1, G-mean of recalls, accuracy (argmax)."""
  p, y = probs[idx], labels[idx]
  if num_classes == 2:
    out = {k: float(v) for k, v in metrics_lib.evaluate_jit(p[:, 1], y, threshold=threshold).items()}
    out["accuracy"] = float(np.mean((p[:, 1] >= threshold) == (y == 1)))
    return out
  return {"auc": metrics_lib.multiclass_auc(p, y), "f1_macro": metrics_lib.multiclass_f1_macro(p, y),
          "gmean": metrics_lib.multiclass_gmean(p, y), "accuracy": metrics_lib.accuracy(p, y)}


def local_rows(host_batch: dict) -> dict:
  """This process's contiguous slice of every leaf (all hosts hold the whole graph; `shard_batch` reassembles
  the global arrays from the slices). The identity on one host."""
  pc, pi = jax.process_count(), jax.process_index()
  if pc == 1:
    return host_batch

  def take(x):
    if x.shape[0] % pc:
      raise ValueError(f"a batch leaf of {x.shape[0]} rows does not split over {pc} processes; use budgets that "
                       "are multiples of the global device count.")
    k = x.shape[0] // pc
    return x[pi * k:(pi + 1) * k]

  return jax.tree.map(take, host_batch)


def fit(config: Any, data: data_lib.GraphData, workdir: str | None = None, mesh=None, model_name: str | None = None,
        progress: bool = False, stop_at: int | None = None) -> dict:
  """Trains one model (config.model.name or `model_name`) on the full graph and evaluates it.

  Config fields: seed, model, optimizer, num_steps, eval_every, log_every, checkpoint_every, mesh,
  monitor ('auc' | 'accuracy' | 'f1_macro', validation metric that selects the kept params), score_fn,
  weighted_loss.

  Args:
    config: ConfigDict (configs/pmp.py).
    data: the graph.
    workdir: metrics.jsonl / checkpoints go here (None: nothing written).
    mesh: device mesh (default from config.mesh); node and edge arrays are split over 'data'.
    model_name: overrides config.model.name ('pmp', 'sage', 'gcn').
    progress: print a progress line.
    stop_at: stop after this step (tests of resume).

  Returns:
    dict: model, test / val metrics of the kept params (binary: threshold tuned on val), threshold, best_step,
    best_val, steps_per_s, history (list of logged rows).
  """
  model_cfg = dict(config.model)
  if model_name is not None:
    model_cfg["name"] = model_name
  model = create_model(model_cfg, data.num_classes)
  mesh = sharding.make_mesh(config.get("mesh")) if mesh is None else mesh
  n_data = mesh.shape[sharding.DATA_AXIS]
  multiple = 64 * n_data // math.gcd(64, n_data)
  host_batch, _ = data_lib.make_batch(data, node_multiple=multiple, edge_multiple=multiple)
  batch = sharding.shard_batch(local_rows(host_batch), mesh)
  num_steps = int(config.num_steps)
  tx = make_optimizer(config.optimizer, num_steps)   # equal settings: one object, so one compiled step
  score_fn = config.get("score_fn", "softmax")
  monitor = config.get("monitor", "auc")
  predict = make_predict(model)
  labels = data.labels

  def eval_fn(state):
    probs = class_scores(jax.device_get(predict(state.params, batch))[:data.num_nodes], score_fn)
    val = split_metrics(probs, labels, data.val_idx, data.num_classes)
    if not np.isfinite(val[monitor]):
      raise ValueError(f"validation {monitor} is not finite ({val[monitor]}); the validation split needs every "
                       "class (and the model may have diverged: lower optimizer.learning_rate).")
    return {f"val_{k}": v for k, v in val.items()}

  init_fn = functools.partial(init, model=model, num_relations=len(data.relations),
                              feature_dim=int(data.x.shape[1]), tx=tx)   # keyed by value in common.loop
  # keep_best: the loop keeps the best-validation parameters in its checkpoints, so a resumed or rerun workdir
  # selects the same step as an uninterrupted run.
  result = loop_lib.train_loop(
      init_fn=init_fn, train_step=make_train_step(model, bool(config.get("weighted_loss", False))),
      batches=lambda step: batch, num_steps=num_steps, key=jax.random.key(int(config.seed)), workdir=workdir,
      mesh=mesh, log_every=int(config.get("log_every", 10)), eval_every=int(config.get("eval_every", 10)),
      eval_fn=eval_fn, config=config if workdir else None, progress=progress, stop_at=stop_at,
      name=f"pmp/{model_cfg['name']}", keep_best=f"eval/val_{monitor}", best_mode="max",
      **loop_lib.checkpoint_options(config))
  params = jax.device_get(result.best_params if result.best_params is not None else result.state.params)
  probs = class_scores(jax.device_get(predict(params, batch))[:data.num_nodes], score_fn)
  threshold = 0.5
  if data.num_classes == 2:
    threshold = metrics_lib.best_f1_threshold(probs[data.val_idx, 1], labels[data.val_idx])
  val = split_metrics(probs, labels, data.val_idx, data.num_classes, threshold)
  test = split_metrics(probs, labels, data.test_idx, data.num_classes, threshold)
  return {"model": model_cfg["name"], "test": test, "val": val, "threshold": threshold,
          "best_step": result.best_step if result.best_step is not None else 0,
          "best_val": float(result.best_metric if result.best_metric is not None else -np.inf),
          "steps_per_s": result.steps_per_s, "history": result.history,
          "params": params, "probs": probs}
