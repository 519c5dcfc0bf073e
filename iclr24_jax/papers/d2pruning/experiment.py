"""D2 Pruning experiments: scores from training dynamics, coresets by five methods, coreset training.

run(config, workdir)       one data set: train the score model, select coresets for every (method, pruning
                           rate, seed), train a fresh classifier on each (all runs batched in one compiled,
                           mesh-sharded vmap), write results.json, metrics.jsonl and plots.
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
from jax.sharding import NamedSharding, PartitionSpec as P

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.papers.d2pruning import data as d2_data
from iclr24_jax.papers.d2pruning import model as model_lib
from iclr24_jax.papers.d2pruning import scores as scores_lib
from iclr24_jax.papers.d2pruning import selection

METHOD_LABELS = {"d2": "D2 Pruning", "d2_nofwd": "D2 without forward MP", "random": "random", "ccs": "CCS",
                 "kcenter": "k-center", "difficulty": "difficulty (top-k)"}


def load_data(config: Any, workdir: str | None = None) -> data_lib.Dataset:
  """The configured data set: 'digits', 'mnist5k', 'npz', 'tfds:<name>' or 'text' (StrategyQA + MiniLM).

  The text embeddings are cached in `config.data.cache_dir` (default: the workdir).
  """
  name = config.data.name
  if name == "text":
    from iclr24_jax.papers.d2pruning import text
    return text.load_text_dataset(config.data.get("data_dir") or None, int(config.data.get("max_train", 0)),
                                  config.data.get("cache_dir") or workdir)
  if name in d2_data.DATASETS:   # the paper's own TFDS sets (DataNotFoundError when absent)
    ds = d2_data.load(config.data)
    if not isinstance(ds, data_lib.Dataset):   # ImageNet streams per host; this pipeline holds train in memory
      raise data_lib.paper_data_not_wired("d2pruning", config.data, "ImageNet per-host grain shards")
    return ds
  return data_lib.load_dataset(name, config.data.get("data_dir") or None)


def compute_scores(config: Any, ds: data_lib.Dataset, key: jax.Array, stages: loop.Stages | None = None) -> dict:
  """Trains the score model on the full train set; returns dynamics scores, embeddings and curves.

  The epochs run in chunks of `config.log_every` as the stage 'scores' (a `ResumableLoop` in `stages.workdir/
  scores`, saving every `config.dynamics.checkpoint_every` epochs and on SIGTERM / SIGINT); its state is the
  TrainState with the per-example dynamics of the epochs run so far, so a resumed stage ends where an
  uninterrupted one does. A row per chunk logs the last epoch's mean train loss and accuracy.

  Args:
    config: the paper config (dynamics, model, optimizer, log_every).
    ds: the data set.
    key: the score model's key.
    stages: where the stage saves (None: nothing saved).

  Returns:
    dict: scores (dict of [N]), embeddings [N, F], curves (dict of [E]), train_s, steps_per_epoch, test_accuracy.

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  dyn_cfg = config.dynamics
  num_epochs = int(dyn_cfg.epochs)
  steps_per_epoch = -(-len(ds.train) // dyn_cfg.batch_size)
  model, tx = model_lib.create_classifier(config, ds.num_classes, num_epochs * steps_per_epoch)
  init, epochs = scores_lib.make_dynamics_chunks(model, tx, ds.input_shape, num_epochs, dyn_cfg.batch_size)
  run_epochs = jax.jit(epochs, static_argnums=5)
  x, y = jnp.asarray(ds.train.x), jnp.asarray(ds.train.y)
  chunk = max(1, min(int(config.log_every) or num_epochs, num_epochs))
  every = int(dyn_cfg.get("checkpoint_every", 0) or 0)
  with loop.stage_loop(stages, "scores", num_epochs, every_steps=every) as lp:
    carry, run = lp.start(lambda: jax.jit(init, static_argnums=1)(key, len(ds.train)))
    while not lp.finished and run.step < num_epochs:
      n = min(chunk, num_epochs - run.step)
      t0 = time.perf_counter()
      carry = jax.block_until_ready(run_epochs(carry, key, x, y, jnp.int32(run.step), n))
      run.extra["train_s"] = run.extra.get("train_s", 0.0) + time.perf_counter() - t0
      curves = jax.device_get(carry["curves"])
      e = run.step + n
      lp.boundary(e, carry, {"score_model/train_loss": float(curves["loss"][e - 1]),
                             "score_model/train_accuracy": float(curves["accuracy"][e - 1])})
    lp.finish(carry)
  state = carry["state"]
  scores = scores_lib.scores_from_dynamics(jax.device_get(carry["dynamics"]), dyn_cfg.el2n_epochs)
  _, feats = model_lib.embed(model, state, ds.train.x)
  logits_test = model_lib.embed(model, state, ds.test.x)[0]
  embed_kind = config.selection.get("embedding", "features")
  emb = feats if embed_kind == "features" else np.asarray(ds.train.x, np.float32).reshape(len(ds.train), -1)
  return {"scores": scores, "embeddings": emb, "curves": jax.device_get(carry["curves"]),
          "train_s": float(run.extra.get("train_s", 0.0)), "steps_per_epoch": steps_per_epoch,
          "test_accuracy": float(np.mean(np.argmax(logits_test, -1) == ds.test.y))}


def _coverage(emb: np.ndarray, idx: np.ndarray, block: int = 1024) -> float:
  """Mean distance from every example to its nearest selected example (lower = better coverage)."""
  x = jnp.asarray(emb, jnp.float32)
  c = x[jnp.asarray(idx)]
  c_sq = jnp.sum(c * c, -1)
  out = []
  for s in range(0, x.shape[0], block):
    q = x[s:s + block]
    d2 = jnp.sum(q * q, -1)[:, None] - 2.0 * q @ c.T + c_sq[None, :]
    out.append(jnp.sqrt(jnp.maximum(jnp.min(d2, -1), 0.0)))
  return float(jnp.mean(jnp.concatenate(out)))


def _d2_gammas(sel_cfg) -> tuple[float, ...]:
  grid = tuple(float(g) for g in sel_cfg.get("gamma_reverse_grid", ()) or ())
  return grid or (float(sel_cfg.gamma_reverse),)


def build_coresets(config: Any, emb: np.ndarray, scores: dict, labels: np.ndarray, key: jax.Array) -> list[dict]:
  """Selects every (method, pruning rate, seed) coreset; deterministic methods are shared across seeds.

  D2 is selected once per gamma_r of `selection.gamma_reverse_grid` (the run picks gamma_r per rate on
  the validation split afterwards; the paper tunes gamma_r per data set). The method 'd2_nofwd' is D2
  without forward message passing (the reverse pass starts from the raw scores), swept the same way.

  Returns:
    rows with method, variant (result key: the method, or 'd2@<gamma_r>'), gamma_reverse, rate, seed,
    indices, select_s.
  """
  sel_cfg = config.selection
  difficulty = scores_lib.as_difficulty(scores, sel_cfg.score_key)
  cutoff = scores_lib.as_difficulty(scores, sel_cfg.cutoff_key)
  rates = tuple(sel_cfg.pruning_rates)
  cutoffs = tuple(sel_cfg.hard_cutoff)
  if len(cutoffs) != len(rates):
    raise ValueError(f"selection.hard_cutoff has {len(cutoffs)} entries but pruning_rates has {len(rates)}; "
                     "give one cutoff per rate.")
  out = []
  for rate, beta in zip(rates, cutoffs):
    for method in sel_cfg.methods:
      is_d2 = method in ("d2", "d2_nofwd")
      for gamma_r in (_d2_gammas(sel_cfg) if is_d2 else (float(sel_cfg.gamma_reverse),)):
        variant = f"{method}@{gamma_r:g}" if is_d2 else method
        cache = None
        for seed in range(config.num_seeds):
          if cache is not None:
            out.append({**cache, "seed": seed})
            continue
          t0 = time.perf_counter()
          idx = selection.select_coreset(
              emb, difficulty, 1.0 - rate, "d2" if is_d2 else method, jax.random.fold_in(key, seed),
              forward=method != "d2_nofwd", small_groups=sel_cfg.get("small_groups", "graph"),
              labels=labels if sel_cfg.class_balanced else None, k=sel_cfg.k, gamma_forward=sel_cfg.gamma_forward,
              gamma_reverse=gamma_r, graph_mode=sel_cfg.graph_mode, hard_cutoff=beta, cutoff_scores=cutoff,
              stratify=sel_cfg.stratify if sel_cfg.class_balanced else "none", num_strata=sel_cfg.num_strata)
          row = {"method": method, "variant": variant, "gamma_reverse": gamma_r, "rate": rate, "seed": seed,
                 "indices": idx, "select_s": time.perf_counter() - t0}
          out.append(row)
          if is_d2 or method == "difficulty":  # no randomness: the same coreset for every seed
            cache = row
  return out


def train_coresets(config: Any, ds: data_lib.Dataset, coresets: list[np.ndarray], key: jax.Array,
                   mesh=None, seeds: list[int] | None = None, stages: loop.Stages | None = None,
                   names: list[str] | None = None) -> dict[str, np.ndarray]:
  """Trains one fresh classifier per coreset (a vmap over runs, sharded over the mesh devices).

  The steps run in chunks of `config.checkpoint_every` (the whole run when 0) as the stage 'coresets' (a
  `ResumableLoop` in `stages.workdir/coresets` over the stacked states [R]; it saves at chunk ends and on
  SIGTERM / SIGINT). Each chunk logs the runs' mean loss at its last step; the final row adds every run's test
  and validation accuracy and final loss under `coreset/<name>/...`.

  Args:
    config: the paper config (model, optimizer, num_steps, batch_size, checkpoint_every, mesh).
    ds: the data set; coresets: R index arrays into ds.train.
    key: training key.
    mesh: device mesh (default from config.mesh).
    seeds: optional [R] seed per run: runs with the same seed share the training key (same
      initialisation and batch-draw stream), so methods are paired by seed. Default: one key per run.
    stages: where the stage saves (None: nothing saved).
    names: optional [R] names of the runs for the final row's keys (default 'run<r>').

  Returns:
    dict of [R] arrays: test_accuracy, val_accuracy, final_loss.

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  mesh = sharding.make_mesh(config.get("mesh")) if mesh is None else mesh
  n_dev = mesh.shape[sharding.DATA_AXIS] * mesh.shape[sharding.MODEL_AXIS]
  r = len(coresets)
  r_pad = -(-r // n_dev) * n_dev
  coresets = list(coresets) + [coresets[-1]] * (r_pad - r)  # pad runs to a multiple of the devices
  idx, sizes = model_lib.pad_coresets(coresets)
  model, tx = model_lib.create_classifier(config, ds.num_classes, config.num_steps)
  init_many, steps_many = model_lib.make_coreset_chunks(model, tx, ds.input_shape, config.batch_size)
  runs = NamedSharding(mesh, P((sharding.DATA_AXIS, sharding.MODEL_AXIS)))
  rep = sharding.replicated_sharding(mesh)
  if seeds is None:
    keys = jax.random.split(key, r_pad)
  else:
    seeds = list(seeds) + [seeds[-1]] * (r_pad - r)
    keys = jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.asarray(seeds, jnp.int32))
  keys = jax.device_put(keys, runs)
  x, y = jnp.asarray(ds.train.x), jnp.asarray(ds.train.y)
  idx, sizes = jnp.asarray(idx), jnp.asarray(sizes)
  init_fn = jax.jit(init_many, in_shardings=runs, out_shardings=runs)
  compiled: dict[int, Any] = {}

  def chunk_fn(n: int):
    if n not in compiled:   # one program per chunk length (two at most: the chunk and a shorter last one)
      compiled[n] = jax.jit(functools.partial(steps_many, n=n), in_shardings=(runs, runs, rep, rep, runs, runs, rep),
                            out_shardings=runs, donate_argnums=0)
    return compiled[n]

  num_steps = int(config.num_steps)
  every = int(config.get("checkpoint_every", 0) or 0)
  chunk = max(1, min(every or num_steps, num_steps))
  names = list(names) if names is not None else [f"run{i}" for i in range(r)]
  evaluate = jax.jit(model_lib.make_batched_eval(model))

  def accuracies(states):
    return tuple(np.asarray(evaluate(states, jnp.asarray(s.x), jnp.asarray(s.y)))[:r] for s in (ds.test, ds.val))

  test = val = None
  with loop.stage_loop(stages, "coresets", num_steps) as lp:
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=runs),
                          jax.eval_shape(init_many, keys))
    states, run = lp.start(lambda: init_fn(keys), target)
    while not lp.finished and run.step < num_steps:
      n = min(chunk, num_steps - run.step)
      states, losses = chunk_fn(n)(states, keys, x, y, idx, sizes, jnp.int32(run.step))
      last = np.asarray(jax.device_get(losses))[:r, -1]
      row = {"coresets/train_loss": float(np.mean(last))}
      if run.step + n < num_steps:
        lp.boundary(run.step + n, states, row)
        continue
      # the last chunk: the final row holds every run's evaluation (computed again from the states on a rerun)
      run.extra["final_loss"] = [float(v) for v in last]
      test, val = accuracies(states)
      for i, name in enumerate(names):
        row.update({f"coreset/{name}/test_accuracy": float(test[i]), f"coreset/{name}/val_accuracy": float(val[i]),
                    f"coreset/{name}/final_loss": float(last[i])})
      lp.finish(states, row=row)
  if test is None:   # a finished stage restored: its states evaluate as they did
    test, val = accuracies(states)
  return {"test_accuracy": test, "val_accuracy": val,
          "final_loss": np.asarray(run.extra["final_loss"], np.float32)}


def _plot_accuracy(results: dict, path: str, title: str) -> str:
  fig, axes = metrics_lib.new_figure(size=(5.0, 3.6))
  ax = axes[0, 0]
  for method, by_rate in results["accuracy"].items():
    rates = sorted(float(r) for r in by_rate)
    means = [by_rate[f"{r:g}"]["mean"] for r in rates]
    stds = [by_rate[f"{r:g}"]["std"] for r in rates]
    ax.errorbar([100 * r for r in rates], means, yerr=stds, marker="o", capsize=3,
                label=METHOD_LABELS.get(method, method), lw=2.2 if method == "d2" else 1.2)
  if results.get("full_data_accuracy"):
    ax.axhline(results["full_data_accuracy"]["mean"], color="gray", ls="--", lw=1, label="full data")
  ax.set_xlabel("pruning rate (%)")
  ax.set_ylabel("test accuracy")
  ax.set_title(title)
  ax.legend(fontsize=7)
  return metrics_lib.save_figure(fig, path)


def _plot_balance(results: dict, path: str, title: str) -> str:
  fig, axes = metrics_lib.new_figure(size=(5.0, 3.6))
  ax = axes[0, 0]
  for method, by_rate in results["coverage"].items():
    rates = sorted(by_rate)
    ax.plot([by_rate[r] for r in rates], [results["mean_difficulty_pct"][method][r] for r in rates], marker="o",
            label=METHOD_LABELS.get(method, method))
    for r in rates:
      ax.annotate(f"{100 * float(r):.0f}%", (by_rate[r], results["mean_difficulty_pct"][method][r]), fontsize=6)
  ax.set_xlabel("coverage radius (mean distance to nearest selected; lower = more diverse)")
  ax.set_ylabel("mean difficulty percentile of selected")
  ax.set_title(title)
  ax.legend(fontsize=7)
  return metrics_lib.save_figure(fig, path)


def run(config: Any, workdir: str) -> dict:
  """One data set: scores, coresets (methods x rates x seeds), coreset training; results + plots.

  The two training stages resume in `workdir/scores` and `workdir/coresets` (their checkpoints and
  metrics.jsonl); the coreset selection between them is a deterministic function of the scores and its key,
  selected again on a resume.

  Args:
    config: the paper config.
    workdir: the run's folder.

  Returns:
    the results dict (also written to results.json).

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped a stage (its checkpoint is saved; a rerun resumes it).
  """
  os.makedirs(workdir, exist_ok=True)
  key = jax.random.key(config.seed)
  key_scores, key_select, key_train = jax.random.split(key, 3)
  ds = load_data(config, workdir)
  stages = loop.Stages.from_config(config, workdir, label="d2pruning")
  sc = compute_scores(config, ds, key_scores, stages)
  rows = build_coresets(config, sc["embeddings"], sc["scores"], ds.train.y, key_select)
  n = len(ds.train)
  coresets = [r["indices"] for r in rows] + [np.arange(n)] * config.num_seeds
  names = [f"{r['variant']}/{r['rate']:g}/seed{r['seed']}" for r in rows]
  names += [f"full/0/seed{s}" for s in range(config.num_seeds)]
  t0 = time.perf_counter()
  seeds = [r["seed"] for r in rows] + list(range(config.num_seeds))
  out = train_coresets(config, ds, coresets, key_train, seeds=seeds, stages=stages, names=names)
  train_s = time.perf_counter() - t0
  acc, val = out["test_accuracy"], out["val_accuracy"]

  difficulty = scores_lib.as_difficulty(sc["scores"], config.selection.score_key)
  pct = np.argsort(np.argsort(difficulty, kind="stable"), kind="stable") / max(n - 1, 1)
  results = {"data": data_lib.describe(ds), "score_model_test_accuracy": sc["test_accuracy"],
             "score_model_train_s": sc["train_s"], "coreset_training_s": train_s, "num_runs": len(coresets),
             "score_key": config.selection.score_key, "cutoff_key": config.selection.cutoff_key,
             "score_summary": {k: {"mean": float(v.mean()), "frac_nonzero": float(np.mean(v != 0))}
                               for k, v in sc["scores"].items()}}
  by_variant: dict = {}
  for i, r in enumerate(rows):
    v, rate = r["variant"], f"{r['rate']:g}"
    d = by_variant.setdefault(v, {}).setdefault(rate, {"per_seed": [], "val_per_seed": [], "select_s": [],
                                                        "method": r["method"]})
    d["per_seed"].append(float(acc[i]))
    d["val_per_seed"].append(float(val[i]))
    d["select_s"].append(r["select_s"])
    if r["seed"] == 0:
      d["coverage"] = _coverage(sc["embeddings"], r["indices"])
      d["difficulty_pct"] = float(pct[r["indices"]].mean())
  for v in by_variant.values():
    for d in v.values():
      d["mean"], d["std"] = float(np.mean(d["per_seed"])), float(np.std(d["per_seed"]))
      d["val_mean"] = float(np.mean(d["val_per_seed"]))
      d["select_s"] = float(np.median(d["select_s"]))
  # D2 (and D2 without the forward pass): gamma_r chosen per pruning rate by validation accuracy (mean over seeds)
  gammas = _d2_gammas(config.selection)
  chosen, d2_variants = {}, []
  for base in ("d2", "d2_nofwd"):
    vs = [f"{base}@{g:g}" for g in gammas if f"{base}@{g:g}" in by_variant]
    d2_variants += vs
    if vs:
      by_variant[base] = {}
      for rate in by_variant[vs[0]]:
        best = max(vs, key=lambda v: by_variant[v][rate]["val_mean"])
        by_variant[base][rate] = dict(by_variant[best][rate], gamma_reverse=float(best.split("@")[1]))
        if base == "d2":
          chosen[rate] = float(best.split("@")[1])
  methods = [m for m in config.selection.methods if m in by_variant]
  results["accuracy"] = {m: {rate: {k: d[k] for k in ("mean", "std", "per_seed", "val_mean")}
                             for rate, d in by_variant[m].items()} for m in methods}
  results["d2_gamma_reverse_chosen"] = chosen
  results["d2_sweep"] = {v: {rate: {"test": d["mean"], "val": d["val_mean"]} for rate, d in by_variant[v].items()}
                         for v in d2_variants}
  results["select_s"] = {m: {rate: d["select_s"] for rate, d in by_variant[m].items()} for m in methods}
  results["coverage"] = {m: {rate: d["coverage"] for rate, d in by_variant[m].items()} for m in methods}
  results["mean_difficulty_pct"] = {m: {rate: d["difficulty_pct"] for rate, d in by_variant[m].items()}
                                    for m in methods}
  full = acc[len(rows):]
  results["full_data_accuracy"] = {"mean": float(np.mean(full)), "std": float(np.std(full)),
                                   "per_seed": [float(a) for a in full]}
  title = f"{ds.name}: {config.model.name}, {config.num_seeds} seeds"
  if jax.process_index() == 0:
    results["plots"] = [_plot_accuracy(results, os.path.join(workdir, f"accuracy_vs_pruning_{ds.name}.png"), title),
                        _plot_balance(results, os.path.join(workdir, f"diversity_vs_difficulty_{ds.name}.png"),
                                      title)]
  metrics_lib.write_results(workdir, results)
  return results
