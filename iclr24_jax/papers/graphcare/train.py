"""Losses, the pure train step, prediction, evaluation, and fits on `common.loop.train_loop` for GraphCare models.

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
from typing import Any, Callable, Iterable, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import checks
from iclr24_jax.common import loop as loop_lib
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
    scalar: binary -> BCE(logits[..., 0], y); multilabel -> BCE averaged over labels; multiclass -> CE. Labels
    outside {0, 1} (binary, multilabel) or [0, out_dim) (multiclass) raise eagerly and give NaN under jit.
  """
  where = "graphcare.task_loss"
  checks.choice(where, "task", task, metrics_lib.TASKS)
  checks.shapes(where, logits=(logits, "... G O"), mask=(mask, "... G"))
  if task == "multiclass":
    checks.dtype(where, "labels", labels, "integer")
    ok = checks.indices(where, "labels", labels, logits.shape[-1], "class ids of the logits.")
  else:
    ok = checks.labels_in(where, "labels", labels, (0, 1), f"{task} targets.")
  return checks.poison(_task_loss(logits, labels, mask, task), ok)


def _task_loss(logits, labels, mask, task):
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
  """`train_step` with the model and task bound: (state, batch, key) -> (state, metrics). A partial of hashable
  arguments, which `common.loop` compiles once per distinct (model, task) across runs."""
  return functools.partial(train_step, model=model, task=task)


def predict_step(params: Any, batch: dict, *, model: nn.Module, task: str) -> dict:
  """Eval-mode probabilities [S, G, ...] and the valid mask [S, G]."""
  logits = apply_batch(model, params, batch, train=False)
  return {"prob": probabilities(logits, task), "valid": batch["valid"], "loss":
          task_loss(logits, batch["label"], batch["valid"], task)}


def init(key: jax.Array, model: nn.Module, sample_batch: dict, tx: optax.GradientTransformation,
         node_embedding: np.ndarray | None = None, relation_embedding: np.ndarray | None = None) -> TrainState:
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
      raise ValueError(f"init: node_embedding has shape {node_embedding.shape}, the model wants {want}.")
    params["node_emb"] = {"embedding": jnp.asarray(node_embedding, jnp.float32)}
  if relation_embedding is not None and "rel_emb" in params:
    want = params["rel_emb"]["embedding"].shape
    if tuple(relation_embedding.shape) != tuple(want):
      raise ValueError(f"init: relation_embedding has shape {relation_embedding.shape}, the model wants {want}.")
    params["rel_emb"] = {"embedding": jnp.asarray(relation_embedding, jnp.float32)}
  return TrainState.create(params, tx)



def compiled_predict(model: nn.Module, task: str, mesh=None) -> Callable:
  """jit(predict_step) over the mesh (params replicated, batch sharded on its shard axis)."""
  mesh = sharding.make_mesh() if mesh is None else mesh
  return _compiled_predict(model, task, mesh)


@functools.lru_cache(maxsize=64)   # one jitted function per static value: jit caches by function identity
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


@flax.struct.dataclass
class SeedStates:
  """S TrainStates trained together: `seeds` has a leading [S] axis on every leaf; `step` is the shared scalar
  step count (what `common.loop.train_loop` reads)."""

  step: jax.Array
  seeds: TrainState

  @property
  def params(self) -> Any:
    """The [S, ...] stacked parameters."""
    return self.seeds.params


@functools.lru_cache(maxsize=64)   # one vmapped step per (model, task, seeds)
def make_seeds_train_step(model: nn.Module, task: str, seeds: tuple[int, ...]) -> Callable:
  """`train_step` for several seeds at once, vmapped: one compiled program trains them together.

  The returned `step(states, batch, key) -> (states, metrics)` takes a `SeedStates` (S TrainStates) and a
  batch whose leaves are [shards, S, ...] (seed s's own batch in column s; the shard axis stays first so it
  shards over the mesh's 'data' axis). Seed s's dropout stream is fold_in(key, seeds[s]), so a seed's run does
  not depend on which other seeds train beside it. Cached per (model, task, seeds): the compiled step is reused.

  Args:
    model: the module; task: 'binary' | 'multiclass' | 'multilabel'; seeds: the S seeds.

  Returns:
    The pure vmapped step; its metrics are [S] arrays.
  """
  seed_ids = np.asarray(seeds, np.uint32)

  def step(states, batch, key):
    keys = jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.asarray(seed_ids))
    one = lambda st, b, k: train_step(st, b, k, model=model, task=task)
    seeds_new, metrics = jax.vmap(one, in_axes=(0, 1, 0))(states.seeds, batch, keys)
    return SeedStates(step=states.step + 1, seeds=seeds_new), metrics

  return step


@functools.lru_cache(maxsize=64)   # one jitted function per static value: jit caches by function identity
def _compiled_seeds_predict(model: nn.Module, task: str, mesh) -> Callable:
  rep, dat = sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)
  fn = jax.vmap(functools.partial(predict_step, model=model, task=task), in_axes=(0, None))
  return jax.jit(fn, in_shardings=(rep, dat), out_shardings=rep)


def collect_seed_predictions(model: nn.Module, params: Any, batches: Iterable[dict], task: str, mesh=None
                             ) -> tuple[np.ndarray, np.ndarray]:
  """Predictions of S stacked parameter sets on the same batches.

  Args:
    model, task: as in `collect_predictions`.
    params: params with a leading [S] seed axis.
    batches: eval batches (graphs.Batcher.eval_batches).
    mesh: device mesh.

  Returns:
    (y_true [n, ...], y_prob [S, n, ...]) over the real patients.
  """
  mesh = sharding.make_mesh() if mesh is None else mesh
  fn = _compiled_seeds_predict(model, task, mesh)
  ys, ps = [], []
  for batch in batches:
    out = jax.device_get(fn(params, sharding.shard_batch(batch, mesh)))
    valid = np.asarray(batch["valid"]).astype(bool)
    ys.append(np.asarray(batch["label"])[valid])
    ps.append(np.stack([np.asarray(p)[valid] for p in out["prob"]]))
  y_prob = np.concatenate(ps, 1)
  if not np.all(np.isfinite(y_prob)):
    raise FloatingPointError("the model produced NaN/inf probabilities (diverged training?); lower "
                             "config.optimizer.learning_rate or set optimizer.grad_clip.")
  return np.concatenate(ys), y_prob


def fit_seeds(model: nn.Module, task: str, tx: optax.GradientTransformation, sample_batch: dict,
              train_batches: Callable[[int, int], dict], num_steps: int, seeds: Sequence[int], mesh=None,
              node_embedding: np.ndarray | None = None, relation_embedding: np.ndarray | None = None,
              val_batches: Sequence[dict] | None = None, eval_every: int = 0, log_every: int = 50,
              steps_per_call: int = 1, workdir: str | None = None) -> dict:
  """Trains one model for several seeds at once (vmapped) with `common.loop.train_loop`; keeps, per seed, the
  parameters of the best validation score (the official loop keeps the best validation-AUROC epoch).

  The eval reports the score of every seed ([S], `val_<primary>_seeds`) and the loop's keep-best keeps each
  seed's best row of the stacked parameters, in its checkpoints when a workdir is given (a resumed run selects
  the same steps as an uninterrupted one).

  Args:
    model, task, tx: what to train.
    sample_batch: any (unstacked) batch, for init shapes.
    train_batches: (seed, step) -> batch of that seed at that step (graphs.Batcher.train_batches(idx, seed)(step)).
    num_steps: optimizer steps.
    seeds: S seeds: seed s initialises from key(s) and draws its own batch order and dropout.
    mesh: device mesh (default: all devices).
    node_embedding, relation_embedding: initial tables.
    val_batches: validation batches; None: no selection, the last parameters are returned.
    eval_every: validate every N steps (and at the end).
    log_every: log the mean loss every N steps.
    steps_per_call: steps per compiled call (a lax.scan chunk); log_every and eval_every must be multiples.
    workdir: metrics.jsonl and checkpoints go here (None: nothing written).

  Returns:
    dict(params [S, ...] (best per seed, or last), best_step [S] (0 where a seed never validated finite),
    best_score [S], history, steps_per_s).
  """
  seeds = tuple(int(s) for s in seeds)
  mesh = sharding.make_mesh() if mesh is None else mesh
  primary = metrics_lib.PRIMARY[task]
  init_keys = jnp.stack([jax.random.split(jax.random.key(s))[0] for s in seeds])

  def init_fn(key):
    del key   # each seed initialises from its own key(seed)
    one = lambda k: init(k, model, sample_batch, tx, node_embedding, relation_embedding)
    return SeedStates(step=jnp.zeros((), jnp.int32), seeds=jax.vmap(one)(init_keys))

  def batches(step):
    return jax.tree.map(lambda *xs: np.stack(xs, 1), *[train_batches(s, step) for s in seeds])

  def seeds_eval(state):
    y, p = collect_seed_predictions(model, state.params, val_batches, task, mesh)
    scores = np.array([metrics_lib.task_metrics(task, y, ps)[primary] for ps in p], np.float64)
    return {f"val_{primary}": float(np.nanmean(scores)), f"val_{primary}_seeds": scores}

  with_val = val_batches is not None
  res = loop_lib.train_loop(init_fn=init_fn, train_step=make_seeds_train_step(model, task, seeds), batches=batches,
                            num_steps=int(num_steps), key=jax.random.key(seeds[0]), workdir=workdir, mesh=mesh,
                            log_every=log_every, eval_every=eval_every, eval_fn=seeds_eval if with_val else None,
                            progress=False, name="graphcare", steps_per_call=steps_per_call,
                            keep_best=f"eval/val_{primary}_seeds" if with_val else None)
  stacked = jax.device_get(res.best_params if res.best_params is not None else res.state.params)
  best_step = np.maximum(np.asarray(res.best_step if res.best_step is not None else [0] * len(seeds)), 0)
  best_score = res.best_metric if res.best_metric is not None else [-np.inf] * len(seeds)
  return {"params": stacked, "best_step": best_step.tolist(), "best_score": list(best_score),
          "history": res.history, "steps_per_s": res.steps_per_s}


def fit(model: nn.Module, task: str, tx: optax.GradientTransformation, sample_batch: dict,
        train_batches: Callable[[int], dict], num_steps: int, seed: int = 0, mesh=None,
        node_embedding: np.ndarray | None = None, relation_embedding: np.ndarray | None = None,
        val_batches: Sequence[dict] | None = None, eval_every: int = 0, steps_per_call: int = 1) -> dict:
  """One seed of `fit_seeds` (kept for callers with one batch stream): returns params without the seed axis.

  The arguments not listed are those of `fit_seeds`.

  Args:
    train_batches: step -> batch.
    seed: the run seed.

  Returns:
    dict(params, best_step, best_score, history, steps_per_s).
  """
  out = fit_seeds(model, task, tx, sample_batch, lambda s, step: train_batches(step), num_steps, (seed,), mesh,
                  node_embedding, relation_embedding, val_batches, eval_every, steps_per_call=steps_per_call)
  out["params"] = jax.tree.map(lambda x: x[0], out["params"])
  out["best_step"], out["best_score"] = out["best_step"][0], out["best_score"][0]
  return out
