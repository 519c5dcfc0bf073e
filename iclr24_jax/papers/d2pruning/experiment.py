"""D2 Pruning experiments: scores from training dynamics, coresets by five methods, coreset training.

run(config, workdir)       one data set: train the score model, select coresets for every (method, pruning
                           rate, seed), train a fresh classifier on each (all runs batched in one compiled,
                           mesh-sharded vmap), write results.json, metrics.jsonl and plots.
The reproduction study and the benchmark are in `study.py`.
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from iclr24_jax.common import data as data_lib
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


def compute_scores(config: Any, ds: data_lib.Dataset, key: jax.Array) -> dict:
  """Trains the score model on the full train set; returns dynamics scores, embeddings and curves."""
  dyn_cfg = config.dynamics
  steps_per_epoch = -(-len(ds.train) // dyn_cfg.batch_size)
  model, tx = model_lib.create_classifier(config, ds.num_classes, dyn_cfg.epochs * steps_per_epoch)
  train = jax.jit(scores_lib.make_dynamics_trainer(model, tx, ds.input_shape, dyn_cfg.epochs, dyn_cfg.batch_size))
  t0 = time.perf_counter()
  state, dynamics, curves = jax.block_until_ready(train(key, ds.train.x, ds.train.y))
  train_s = time.perf_counter() - t0
  scores = scores_lib.scores_from_dynamics(jax.device_get(dynamics), dyn_cfg.el2n_epochs)
  _, feats = model_lib.embed(model, state, ds.train.x)
  logits_test = model_lib.embed(model, state, ds.test.x)[0]
  embed_kind = config.selection.get("embedding", "features")
  emb = feats if embed_kind == "features" else np.asarray(ds.train.x, np.float32).reshape(len(ds.train), -1)
  return {"scores": scores, "embeddings": emb, "curves": jax.device_get(curves), "train_s": train_s,
          "steps_per_epoch": steps_per_epoch,
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
                   mesh=None, seeds: list[int] | None = None) -> dict[str, np.ndarray]:
  """Trains one fresh classifier per coreset (a vmap over runs, sharded over the mesh devices).

  Args:
    config: the paper config (model, optimizer, num_steps, batch_size, mesh).
    ds: the data set; coresets: R index arrays into ds.train.
    key: training key.
    mesh: device mesh (default from config.mesh).
    seeds: optional [R] seed per run: runs with the same seed share the training key (same
      initialisation and batch-draw stream), so methods are paired by seed. Default: one key per run.

  Returns:
    dict of [R] arrays: test_accuracy, val_accuracy, final_loss.
  """
  mesh = sharding.make_mesh(config.get("mesh")) if mesh is None else mesh
  n_dev = mesh.shape[sharding.DATA_AXIS] * mesh.shape[sharding.MODEL_AXIS]
  r = len(coresets)
  r_pad = -(-r // n_dev) * n_dev
  coresets = list(coresets) + [coresets[-1]] * (r_pad - r)  # pad runs to a multiple of the devices
  idx, sizes = model_lib.pad_coresets(coresets)
  model, tx = model_lib.create_classifier(config, ds.num_classes, config.num_steps)
  train_many = model_lib.make_coreset_trainer(model, tx, ds.input_shape, config.num_steps, config.batch_size)
  runs = NamedSharding(mesh, P((sharding.DATA_AXIS, sharding.MODEL_AXIS)))
  rep = sharding.replicated_sharding(mesh)
  fn = jax.jit(train_many, in_shardings=(runs, rep, rep, runs, runs), out_shardings=runs)
  if seeds is None:
    keys = jax.random.split(key, r_pad)
  else:
    seeds = list(seeds) + [seeds[-1]] * (r_pad - r)
    keys = jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.asarray(seeds, jnp.int32))
  states, losses = fn(keys, jnp.asarray(ds.train.x), jnp.asarray(ds.train.y), jnp.asarray(idx), jnp.asarray(sizes))
  evaluate = jax.jit(model_lib.make_batched_eval(model))
  test = evaluate(states, jnp.asarray(ds.test.x), jnp.asarray(ds.test.y))
  val = evaluate(states, jnp.asarray(ds.val.x), jnp.asarray(ds.val.y))
  return {"test_accuracy": np.asarray(test)[:r], "val_accuracy": np.asarray(val)[:r],
          "final_loss": np.asarray(losses)[:r, -1]}


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
  """One data set: scores, coresets (methods x rates x seeds), coreset training; results + plots."""
  os.makedirs(workdir, exist_ok=True)
  key = jax.random.key(config.seed)
  key_scores, key_select, key_train = jax.random.split(key, 3)
  ds = load_data(config, workdir)
  sc = compute_scores(config, ds, key_scores)
  writer = metrics_lib.open_writer(workdir)
  for e in range(config.dynamics.epochs):
    if (e + 1) % max(int(config.log_every), 1) == 0 or e + 1 == config.dynamics.epochs:
      writer.write((e + 1) * sc["steps_per_epoch"], {"score_model/train_loss": sc["curves"]["loss"][e],
                                                      "score_model/train_accuracy": sc["curves"]["accuracy"][e]})
  rows = build_coresets(config, sc["embeddings"], sc["scores"], ds.train.y, key_select)
  n = len(ds.train)
  coresets = [r["indices"] for r in rows] + [np.arange(n)] * config.num_seeds
  t0 = time.perf_counter()
  seeds = [r["seed"] for r in rows] + list(range(config.num_seeds))
  out = train_coresets(config, ds, coresets, key_train, seeds=seeds)
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
    writer.write(config.num_steps, {f"coreset/{v}/{rate}/seed{r['seed']}/test_accuracy": float(acc[i]),
                                    f"coreset/{v}/{rate}/seed{r['seed']}/val_accuracy": float(val[i]),
                                    f"coreset/{v}/{rate}/seed{r['seed']}/final_loss": float(out['final_loss'][i])})
  writer.close()
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
