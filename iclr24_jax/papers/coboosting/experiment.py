"""Co-Boosting experiments: one-shot FL on Dirichlet partitions, Co-Boosting vs DENSE-like vs FedAvg vs ensemble.

run(config, workdir)       partition the training set, train the clients once, then every method in
                           config.methods on the real test set; writes results.json and plots in workdir, the
                           clients' checkpoint in workdir/clients/checkpoints and, per distilled method,
                           workdir/<method>/{metrics.jsonl, checkpoints} (server, ensemble weights and pool every
                           config.checkpoint_every epochs and/or checkpoint_every_secs seconds, through
                           `common.loop`'s pieces); a killed run resumes from them, a finished one trains nothing.
The reproduction study and the benchmark are in `study.py`.
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
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.papers.coboosting import clients as clients_lib
from iclr24_jax.papers.coboosting import data as cb_data
from iclr24_jax.papers.coboosting import coboost
from iclr24_jax.papers.coboosting import model as model_lib
from iclr24_jax.papers.coboosting import partition as partition_lib
from iclr24_jax.vision.models import create_model

DISTILLED = ("coboosting", "dense")
LABELS = {"coboosting": "Co-Boosting", "dense": "DENSE-like", "fedavg": "FedAvg (1 round)",
          "ensemble": "uniform ensemble"}


def resolve_vmap(flag: Any) -> bool:
  """config.client.vmap: True / False, or 'auto' = vmap on GPU/TPU, unrolled on CPU (faster there)."""
  if isinstance(flag, str):
    if flag != "auto":
      raise ValueError(f"client.vmap must be True, False or 'auto' (got '{flag}').")
    return jax.default_backend() != "cpu"
  return bool(flag)


def make_method(config: Any, clients: model_lib.ClientSet, server: Any, image_shape: tuple[int, ...],
                num_classes: int, name: str = "coboosting") -> coboost.Method:
  """The Method of `name` ('coboosting' or 'dense') from the config."""
  if name not in DISTILLED:
    raise ValueError(f"make_method: '{name}' is not a distillation method; choose from {DISTILLED}.")
  if image_shape[0] != image_shape[1] or image_shape[0] % 4:
    raise ValueError(f"the generator makes square images with a side divisible by 4; data has {image_shape}.")
  cb = config.coboost
  method = coboost.Method(
      clients=clients, server=server,
      generator=model_lib.Generator(image_size=image_shape[0], channels=image_shape[2], ngf=int(config.generator.ngf)),
      num_classes=num_classes, nz=int(config.generator.nz), hardness=float(cb.hardness),
      oh_weight=float(cb.oh_weight), adv_weight=float(cb.adv_weight), adv_temperature=float(cb.adv_temperature),
      lr_g=float(cb.lr_g), gen_grad_clip=float(cb.gen_grad_clip), mu=float(cb.mu), mu_decay=float(cb.mu_decay),
      ods_eps=float(cb.ods_eps), ods_temperature=float(cb.ods_temperature), kd_temperature=float(cb.kd_temperature),
      kd_momentum=float(config.optimizer.get("momentum", 0.9)),
      kd_weight_decay=float(config.optimizer.get("weight_decay", 1e-4)),
      kd_grad_clip=float(config.optimizer.get("grad_clip", 10.0)))
  if config.optimizer.get("name", "sgd") != "sgd" or config.optimizer.get("schedule", "cosine") != "cosine":
    raise ValueError("the server optimizer is the official SGD + per-epoch cosine schedule; set optimizer.name="
                     "'sgd' and optimizer.schedule='cosine' (other values are not supported).")
  return coboost.dense_like(method) if name == "dense" else method


def _accuracy(logits: Any, y: np.ndarray) -> float:
  return float(np.mean(np.argmax(np.asarray(logits), -1) == np.asarray(y)))


@functools.lru_cache(maxsize=8)   # one jitted function per static value: jit caches by function identity
def _jitted_logits(clients: model_lib.ClientSet):
  return jax.jit(clients.logits)


@functools.lru_cache(maxsize=8)   # one jitted function per static value: jit caches by function identity
def _jitted_apply(model: Any):
  return jax.jit(lambda p, x: model.apply({"params": p}, x))


def _abstract_clients(models: list, input_shape: tuple[int, ...], stacked: bool):
  shapes = [jax.eval_shape(lambda m=m: m.init(jax.random.key(0), jnp.zeros((1,) + input_shape))["params"])
            for m in models]
  if stacked:
    return jax.tree.map(lambda *s: jax.ShapeDtypeStruct((len(s),) + s[0].shape, s[0].dtype), *shapes)
  return tuple(shapes)


def setup_clients(config: Any, ds: data_lib.Dataset, key: jax.Array, workdir: str | None = None):
  """Partition + one-shot local training, or the clients a run in `workdir` trained and saved before.

  With a workdir the trained clients are saved once in `workdir/clients/checkpoints` (a finished one-step loop:
  `common.loop.CheckpointHook`), so a resumed or repeated run never retrains them.

  Args:
    config: see configs/coboosting.py (fl, client).
    ds: the data set (its train split is partitioned).
    key: split into the partition and the local-training keys.
    workdir: the run's folder (None: nothing saved or restored).

  Returns:
    (parts, ClientSet, client params, seconds the local training took (when it ran, also on a resumed run)).
  """
  from iclr24_jax.common import loop as loop_lib
  key_part, key_train = jax.random.split(key)
  c = int(config.fl.num_clients)
  parts = partition_lib.dirichlet_partition(ds.train.y, c, float(config.fl.alpha), key_part)
  models = model_lib.client_models(list(config.client.models), c, ds.num_classes)
  vmap = resolve_vmap(config.client.get("vmap", "auto"))
  stacked = all(m == models[0] for m in models)
  hook = None
  if workdir:
    hook = loop_lib.CheckpointHook(os.path.join(workdir, "clients", "checkpoints"), max_to_keep=1, config=config)
  try:
    got = hook.restore_latest({"clients": _abstract_clients(models, ds.input_shape, stacked)}) if hook else None
    if got is not None:
      state, run = got
      cs = (model_lib.ClientSet((models[0],), c, True, vmap) if stacked
            else model_lib.ClientSet(tuple(models), c, stacked=False))
      return parts, cs, state["clients"], float(run.extra.get("train_s", 0.0))
    t0 = time.perf_counter()
    cs, params = clients_lib.train_clients(
        models, ds.train.x, ds.train.y, parts, key_train, local_epochs=int(config.client.local_epochs),
        batch_size=int(config.client.batch_size), optimizer=config.client.optimizer, vmap=vmap,
        same_init=bool(config.fl.get("same_init", True)))
    params = jax.block_until_ready(params)
    seconds = time.perf_counter() - t0
    if hook is not None:
      hook.finish(1, {"clients": params}, loop_lib.LoopState(step=1, extra={"train_s": seconds}))
  finally:
    if hook is not None:
      hook.close()
  return parts, cs, params, seconds


def run(config: Any, workdir: str | None = None) -> dict:
  """Runs one one-shot FL experiment; returns (and writes to workdir/results.json) the test accuracies.

  Args:
    config: see configs/coboosting.py.
    workdir: output folder (None: nothing is written).

  Returns:
    dict with '<method>/test_accuracy' for every method in config.methods, client accuracies, the final
    ensemble weights, the partition's mean label entropy and timings.
  """
  unknown = set(config.methods) - {"coboosting", "dense", "fedavg", "ensemble"}
  if unknown:
    raise ValueError(f"unknown methods {sorted(unknown)}; choose from coboosting, dense, fedavg, ensemble.")
  if config.data.name in cb_data.DATASETS:   # the paper's own TFDS sets (DataNotFoundError when absent)
    ds = cb_data.load(config.data)
  else:
    ds = data_lib.load_dataset(config.data.name, config.data.get("data_dir") or None)
  key = jax.random.key(int(config.seed))
  key_clients, key_server = jax.random.split(key)
  parts, clients, cparams, client_s = setup_clients(config, ds, key_clients, workdir)
  k = ds.num_classes
  x_test, y_test = jnp.asarray(ds.test.x), np.asarray(ds.test.y)
  test_logits = np.asarray(_jitted_logits(clients)(cparams, x_test))  # [C, N, K]
  results: dict[str, Any] = {
      "data": data_lib.describe(ds), "alpha": float(config.fl.alpha), "num_clients": clients.num_clients,
      "seed": int(config.seed), "partition_label_entropy": partition_lib.mean_label_entropy(ds.train.y, parts, k),
      "partition_counts": partition_lib.label_histogram(ds.train.y, parts, k).tolist(),
      "client_test_accuracy": np.mean(np.argmax(test_logits, -1) == y_test[None], axis=1).tolist(),
      "client_train_s": client_s, "methods": list(config.methods)}
  uniform = jnp.full((clients.num_clients,), 1.0 / clients.num_clients)
  ens_uniform = _accuracy(coboost.losses.ensemble_logits(jnp.asarray(test_logits), uniform), y_test)
  results["ensemble_probability_average_accuracy"] = _accuracy(jax.nn.softmax(test_logits, -1).mean(0), y_test)
  if "ensemble" in config.methods:
    results["ensemble/test_accuracy"] = ens_uniform
  server_model = create_model(config.model, k)
  if "fedavg" in config.methods:
    if clients.stacked and clients.models[0] == server_model:
      avg = model_lib.fedavg_params(cparams)
      results["fedavg/test_accuracy"] = _accuracy(_jitted_apply(server_model)(avg, x_test), y_test)
    else:
      results["fedavg/test_accuracy"] = None
      results["fedavg/note"] = "FedAvg needs identical client and server architectures; skipped."
  mesh = sharding.make_mesh(config.get("mesh"))
  curves, fits = {}, {}
  for name in [m for m in config.methods if m in DISTILLED]:
    method = make_method(config, clients, server_model, ds.input_shape, k, name)
    comp = coboost.compiled(method, mesh, int(config.batch_size), ds.input_shape)

    def eval_fn(server, weights, comp=comp):
      s_logits = comp.server_logits(server.params, server.extra, x_test)
      t_logits = comp.teacher_logits({"clients": cparams, "weights": jnp.asarray(weights)}, x_test)
      return {"eval/server_accuracy": _accuracy(s_logits, y_test),
              "eval/weighted_ensemble_accuracy": _accuracy(t_logits, y_test)}

    # Paired by seed: Co-Boosting and the DENSE-like baseline draw the same server-init, generator and
    # distillation keys, so their difference is the method's, not the draw's.
    res = coboost.fit(method, cparams, key=key_server,
                      input_shape=ds.input_shape, epochs=int(config.num_epochs),
                      g_steps=int(config.coboost.g_steps), batch_size=int(config.batch_size),
                      kd_lr=float(config.optimizer.learning_rate), mesh=mesh, eval_fn=eval_fn,
                      eval_every=int(config.eval_every), workdir=os.path.join(workdir, name) if workdir else None,
                      name=name, progress=bool(config.get("progress", True)) and jax.process_index() == 0,
                      checkpoint_every=int(config.get("checkpoint_every", 0) or 0),
                      checkpoint_every_secs=float(config.get("checkpoint_every_secs", 0.0) or 0.0), config=config)
    fits[name] = res
    final = res.history[-1] if res.history else eval_fn(res.server, res.weights)
    results[f"{name}/test_accuracy"] = final.get("eval/server_accuracy")
    results[f"{name}/weighted_ensemble_accuracy"] = final.get("eval/weighted_ensemble_accuracy")
    evals = [(r["step"], r["eval/server_accuracy"]) for r in res.history if "eval/server_accuracy" in r]
    if evals:  # the official code reports the best test accuracy over the evaluated epochs
      best_epoch, best_acc = max(evals, key=lambda e: e[1])
      results[f"{name}/best_test_accuracy"], results[f"{name}/best_epoch"] = best_acc, best_epoch
    results[f"{name}/weights"] = res.weights.tolist()
    results[f"{name}/seconds"] = res.seconds
    results[f"{name}/epoch_median_s"] = (float(np.median([r["time/epoch_s"] for r in res.history[1:]]))
                                         if len(res.history) > 1 else None)
    curves[name] = evals
  results["curves"] = curves
  if workdir:
    if config.get("plots", True) and jax.process_index() == 0:
      results["plots"] = _plots(workdir, results, fits, clients.num_clients)
    metrics_lib.write_results(workdir, results)
  return results


def _plots(workdir: str, results: dict, fits: dict, num_clients: int) -> list[str]:
  paths = []
  fig, axes = metrics_lib.new_figure(ncols=2, size=(4.5, 3.2))
  ax = axes[0, 0]
  for name, pts in results["curves"].items():
    if pts:
      xs, ys = zip(*pts)
      ax.plot(xs, ys, marker="o", label=LABELS[name])
  for name, style in (("fedavg", "--"), ("ensemble", ":")):
    v = results.get(f"{name}/test_accuracy")
    if v is not None:
      ax.axhline(v, linestyle=style, color="gray", label=LABELS[name])
  ax.set_xlabel("server epoch")
  ax.set_ylabel("test accuracy")
  ax.set_title(f"alpha={results['alpha']}")
  ax.legend(fontsize=7)
  ax = axes[0, 1]
  if "coboosting" in fits and len(fits["coboosting"].weight_history):
    wh = fits["coboosting"].weight_history
    for c in range(num_clients):
      ax.plot(np.arange(1, len(wh) + 1), wh[:, c], lw=1)
    ax.set_title("Co-Boosting ensemble weights")
    ax.set_xlabel("server epoch")
  paths.append(metrics_lib.save_figure(fig, os.path.join(workdir, "curves.png")))
  for name, res in fits.items():
    if len(res.pool_x):
      n = min(32, len(res.pool_x))
      paths.append(metrics_lib.plot_image_grid(res.pool_x[-n:], os.path.join(workdir, f"synthetic_{name}.png"),
                                               title=f"{LABELS[name]} synthetic pool (last batch), targets: "
                                               + " ".join(str(int(v)) for v in res.pool_y[-n:][:16])))
  return paths


# ------------------------------------------------------------------------------------------ reproduce


# ------------------------------------------------------------------------------------------ benchmark
