"""cdgm experiments: run one (C-)DGM on a table, the paper's small reproduction, and the layer benchmark."""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import bench
from iclr24_jax.common import checkpoint as ckpt_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.papers.cdgm import data as data_lib
from iclr24_jax.papers.cdgm import evaluation
from iclr24_jax.papers.cdgm import model as model_lib
from iclr24_jax.papers.cdgm import orderings
from iclr24_jax.papers.cdgm import train as train_lib
from iclr24_jax.papers.cdgm import transform as tfm
from iclr24_jax.papers.cdgm.constraints import Constraints
from iclr24_jax.papers.cdgm.layer import ConstraintLayer, violation_rate

PAPER = "cdgm"


# --------------------------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------------------------


def _adam(opt: Any) -> optax.GradientTransformation:
  """torch-style Adam with L2 weight decay added to the gradient (the official optimizers)."""
  tx = optax.adam(float(opt.learning_rate), b1=float(opt.b1), b2=float(opt.b2))
  wd = float(opt.get("weight_decay", 0.0))
  return optax.chain(optax.add_decayed_weights(wd), tx) if wd else tx


def build_model(config: Any, tf: tfm.TableTransform, layer: ConstraintLayer | None, version: str):
  """TVAE or CTGAN from `config.model` / `config.optimizer`.

  Args:
    config: the experiment config (model.name 'tvae' | 'ctgan').
    tf: the fitted transform.
    layer: the Constraint Layer (ignored for 'unconstrained').
    version: 'unconstrained' | 'postprocessing' | 'constrained'.

  Returns:
    A `model.TVAE` or `model.CTGAN`.
  """
  m, opt = config.model, config.optimizer
  layer = None if version == "unconstrained" else layer
  if m.name == "tvae":
    return model_lib.TVAE(tf, layer, version, _adam(opt.tvae), embedding_dim=int(m.embedding_dim),
                          compress_dims=tuple(m.hidden), decompress_dims=tuple(m.hidden),
                          loss_factor=float(m.loss_factor), batch_size=int(m.batch_size))
  if m.name == "ctgan":
    return model_lib.CTGAN(tf, layer, version, _adam(opt.ctgan_g), _adam(opt.ctgan_d),
                           embedding_dim=int(m.embedding_dim), generator_dim=tuple(m.hidden),
                           discriminator_dim=tuple(m.hidden), pac=int(m.pac), batch_size=int(m.batch_size))
  raise ValueError(f"unknown model.name '{m.name}'; choose 'tvae' or 'ctgan'.")


def model_data(model: Any, tf: tfm.TableTransform, encoded: np.ndarray) -> dict:
  """Device data for `model.make_batch`."""
  if isinstance(model, model_lib.CTGAN):
    return model_lib.conditional_data(tf, encoded)
  return {"x": jnp.asarray(encoded, jnp.float32)}


def sample_rows(model: Any, state: Any, data: dict, key: jax.Array, num: int, apply_layer: bool,
                chunk: int = 5000) -> np.ndarray:
  """Samples `num` rows (jitted, in chunks) with or without the layer."""
  if isinstance(model, model_lib.CTGAN):
    fn = jax.jit(lambda s, k, n=chunk: model.sample(s, k, n, cond_prob=data.get("cond_prob"), apply_layer=apply_layer))
    arg = state
  else:
    fn = jax.jit(lambda p, k, n=chunk: model.sample(p, k, n, apply_layer=apply_layer))
    arg = state.params
  out = []
  for i in range(-(-num // chunk)):
    out.append(np.asarray(fn(arg, jax.random.fold_in(key, i))))
  return np.concatenate(out)[:num].astype(np.float64)


def prepare_table(config: Any) -> tuple[data_lib.Table, tfm.TableTransform, np.ndarray]:
  """Loads the table, fits the transform and encodes the training rows."""
  table = data_lib.load_table(config.data.name, config.data.get("data_dir") or None)
  tf = tfm.fit_transform(table.train, table.discrete, max_clusters=int(config.data.max_clusters),
                         seed=int(config.seed), max_fit_rows=config.data.get("gmm_fit_rows") or None,
                         max_iter=int(config.data.get("gmm_max_iter", 100)))
  return table, tf, tfm.encode(tf, table.train, seed=int(config.seed))


def _ordered(constraints: Constraints, how: str, seed: int, real=None, synthetic=None) -> Constraints:
  if how == "given":
    return constraints
  if how == "random":
    return orderings.random_ordering(constraints, seed)
  if how == "corr":
    if synthetic is None:
      raise ValueError("the 'corr' ordering needs samples of the unconstrained model.")
    return orderings.correlation_ordering(constraints, real, synthetic)
  raise ValueError(f"unknown constraints.ordering '{how}'; choose 'given', 'random' or 'corr'.")


def evaluate_rows(table: data_lib.Table, rows: np.ndarray, seed: int, integer_cast: str = "round") -> dict:
  """Violation rate (on the raw rows), utility F1 and detection F1/accuracy (on rows cast to the training dtypes).

  Args:
    table: the table (test rows, label, integer columns, constraints).
    rows: [N, D] synthetic rows.
    seed: classifier seed.
    integer_cast: how integer columns are cast before utility/detection: 'round' (default), 'trunc' (the official
      `prepare_gen_data`, whose `astype(X_train.dtypes)` truncates toward zero, e.g. 0.99 -> 0 for a 0/1 column)
      or 'none'.

  Returns:
    dict with violation_rate, utility_f1, detection_f1, detection_accuracy and the per-classifier details.
  """
  if integer_cast not in ("round", "trunc", "none"):
    raise ValueError(f"integer_cast must be 'round', 'trunc' or 'none', got '{integer_cast}'.")
  cast = np.array(rows, np.float64, copy=True)
  if table.integer_columns and integer_cast != "none":
    cols = list(table.integer_columns)
    cast[:, cols] = (np.round if integer_cast == "round" else np.trunc)(cast[:, cols])
  util = evaluation.utility(cast, table.test, table.label, table.num_classes, seed)
  det = evaluation.detection(table.train, cast, seed)
  return {"violation_rate": float(violation_rate(rows, table.constraints)), "utility_f1": util["f1"],
          "detection_f1": det["f1"], "detection_accuracy": det["accuracy"], "utility": util, "detection": det}


def _plot_pair(table: data_lib.Table, samples: dict[str, np.ndarray], path: str) -> str | None:
  """Scatter of the first two-variable constraint's variables: real vs each sample set."""
  pair = None
  for i in range(table.constraints.num_constraints):
    nz = np.nonzero(table.constraints.coefficients[i])[0]
    if len(nz) == 2:
      pair = (int(nz[0]), int(nz[1]), i)
      break
  if pair is None:
    return None
  a, b, i = pair
  fig, axes = metrics_lib.new_figure(ncols=1 + len(samples), size=(3.2, 3.0))
  sets = {"real (train)": table.train, **samples}
  for ax, (name, rows) in zip(axes[0], sets.items()):
    r = rows[:1500]
    ax.scatter(r[:, a], r[:, b], s=2, alpha=0.4)
    lo, hi = np.nanmin(table.train[:, [a, b]]), np.nanmax(table.train[:, [a, b]])
    ax.set_title(f"{name}\nviol={float(violation_rate(rows, table.constraints)):.1%}", fontsize=8)
    ax.set_xlabel(table.columns[a], fontsize=7)
    ax.set_ylabel(table.columns[b], fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
  fig.suptitle(f"{table.name}: constraint '{table.constraints.texts[i]}'", fontsize=9, y=1.06)
  return metrics_lib.save_figure(fig, path)


# --------------------------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------------------------


def run(config: Any, workdir: str) -> dict:
  """Trains config.model (config.model.version) on config.data, samples, evaluates, writes results and plots.

  With constraints.ordering == 'corr' an unconstrained model is trained first (same budget) and its samples
  define the ordering, as in the official pipeline.
  """
  os.makedirs(workdir, exist_ok=True)
  t0 = time.perf_counter()
  seed = int(config.seed)
  key = jax.random.key(seed)
  key_pre, key_train, key_sample = jax.random.split(key, 3)
  table, tf, enc = prepare_table(config)
  version = config.model.version
  constraints = table.constraints
  if config.constraints.ordering == "corr" and version != "unconstrained":
    pre = build_model(config, tf, None, "unconstrained")
    pre_data = model_data(pre, tf, enc)
    res = train_lib.fit(pre, pre_data, int(config.num_steps), key_pre, int(config.log_every))
    synth = sample_rows(pre, res.state, pre_data, key_sample, len(table.train), apply_layer=False)
    constraints = _ordered(constraints, "corr", seed, table.train, synth)
  else:
    constraints = _ordered(constraints, config.constraints.ordering, seed)
  layer = ConstraintLayer(constraints, table.num_features, epsilon=float(config.constraints.epsilon),
                          schedule=config.constraints.schedule)
  model = build_model(config, tf, layer, version)
  data = model_data(model, tf, enc)
  writer = metrics_lib.MetricWriter(workdir)
  res = train_lib.fit(model, data, int(config.num_steps), key_train, int(config.log_every), writer=writer,
                      progress=True, name="train")
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), config=config)
  ckpt.save(int(config.num_steps), res.state)
  ckpt.close()
  n = int(config.num_samples)
  raw = sample_rows(model, res.state, data, key_sample, n, apply_layer=False)
  # model.sample(apply_layer=True) == layer(model.sample(apply_layer=False)) for the same key.
  final = raw if version == "unconstrained" else np.asarray(jax.jit(layer)(jnp.asarray(raw, jnp.float32)), np.float64)
  ev = evaluate_rows(table, final, seed)
  results = {"data": table.name, "model": config.model.name, "version": version, "num_steps": int(config.num_steps),
             "ordering": config.constraints.ordering, "num_samples": n,
             "violation_rate": ev["violation_rate"],
             "violation_rate_before_layer": float(violation_rate(raw, table.constraints)),
             "violation_rate_real_train": float(violation_rate(table.train, table.constraints)),
             "utility_f1": ev["utility_f1"], "detection_f1": ev["detection_f1"],
             "detection_accuracy": ev["detection_accuracy"],
             "utility_real_f1": evaluation.utility(table.train, table.test, table.label, table.num_classes, seed)["f1"],
             "layer": layer.stats, "train_seconds": res.seconds, "steps_per_s": res.steps_per_s,
             "seconds": time.perf_counter() - t0}
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0:
    metrics_lib.plot_curves(res.history, ["train/loss"], os.path.join(workdir, "loss.png"),
                            title=f"{table.name} {config.model.name} ({version})")
    _plot_pair(table, {"before layer": raw, f"{version}": final}, os.path.join(workdir, "constraint_pair.png"))
  return results


# --------------------------------------------------------------------------------------------------------------
# reproduce
# --------------------------------------------------------------------------------------------------------------


def compare_versions(config: Any, table: data_lib.Table, tf: tfm.TableTransform, enc: np.ndarray,
                     num_samples: int) -> dict:
  """Unconstrained vs P- (layer at sampling only) vs C- (layer in training and sampling) for one model.

  The C- model's ordering follows config.constraints.ordering ('corr' uses the unconstrained model's samples).
  """
  seed = int(config.seed)
  key_u, key_c, key_s = jax.random.split(jax.random.key(seed), 3)
  unc = build_model(config, tf, None, "unconstrained")
  data = model_data(unc, tf, enc)
  res_u = train_lib.fit(unc, data, int(config.num_steps), key_u, int(config.log_every))
  rows_u = sample_rows(unc, res_u.state, data, key_s, num_samples, apply_layer=False)
  constraints = _ordered(table.constraints, config.constraints.ordering, seed, table.train, rows_u)
  layer = ConstraintLayer(constraints, table.num_features, epsilon=float(config.constraints.epsilon))
  correct = jax.jit(layer)
  rows_p = np.asarray(correct(jnp.asarray(rows_u, jnp.float32)), np.float64)
  con = build_model(config, tf, layer, "constrained")
  res_c = train_lib.fit(con, data, int(config.num_steps), key_c, int(config.log_every))
  # model.sample(apply_layer=True) is layer(model.sample(apply_layer=False)) for the same key; sampling once and
  # applying the (already compiled) layer gives both without a second compile.
  rows_c_raw = sample_rows(con, res_c.state, data, key_s, num_samples, apply_layer=False)
  rows_c = np.asarray(correct(jnp.asarray(rows_c_raw, jnp.float32)), np.float64)
  out = {"unconstrained": evaluate_rows(table, rows_u, seed), "postprocessing": evaluate_rows(table, rows_p, seed),
         "constrained": evaluate_rows(table, rows_c, seed),
         "constrained_violation_before_layer": float(violation_rate(rows_c_raw, table.constraints)),
         "train_seconds": res_u.seconds + res_c.seconds, "samples": {"unconstrained": rows_u, "C-": rows_c}}
  return out


def _reproduce_config(name: str, model: str, fast: bool):
  from iclr24_jax.configs import cdgm as cfg_mod
  c = cfg_mod.get_config(f"{name}_{model}")
  c.num_steps = int(c.reproduce_steps_fast if fast else c.reproduce_steps)
  c.log_every = c.num_steps
  c.constraints.ordering = "corr"  # the paper's heuristic, from the unconstrained model's samples
  if fast:
    c.data.gmm_fit_rows = 500
    c.data.gmm_max_iter = 30
  return c


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  """Violation, utility and detection of TVAE / CTGAN vs their P- and C- versions on HELOC, faults (shared
  data, when present) and the embedded generated table."""
  os.makedirs(workdir, exist_ok=True)
  names = ["generated"]
  if data_lib.cdgm_data_dir(required=False) is not None:
    names += ["heloc", "faults"]
  if fast:
    names = names[:1]
  models = ["tvae"] if fast else ["tvae", "ctgan"]
  rows, table_cache = [], {}
  for name in names:
    for model in models:
      c = _reproduce_config(name, model, fast)
      if name not in table_cache:
        table_cache[name] = prepare_table(c)
      table, tf, enc = table_cache[name]
      n = min(len(table.train), 3000 if fast else len(table.train))
      t0 = time.perf_counter()
      r = compare_versions(c, table, tf, enc, n)
      secs = time.perf_counter() - t0
      print(f"[cdgm reproduce] {name} {model}: {secs:.1f}s wall, {time.process_time():.1f}s process cpu so far",
            flush=True)
      u, p, k = r["unconstrained"], r["postprocessing"], r["constrained"]
      plot = _plot_pair(table, {f"{model}": r["samples"]["unconstrained"], f"C-{model}": r["samples"]["C-"]},
                        os.path.join(workdir, f"{name}_{model}_pair.png"))
      plots = [plot] if plot else []
      exp = f"{name} {model.upper()} ({c.num_steps} steps, ordering={c.constraints.ordering})"
      real_v = float(violation_rate(table.train, table.constraints))
      notes = (f"real train rows violate {real_v:.1%}; C- samples before the layer violate "
               f"{r['constrained_violation_before_layer']:.1%}; {secs:.0f}s")
      rows.append(dict(paper=PAPER, experiment=exp, metric="violation rate: unconstrained", ours=u["violation_rate"],
                       paper_value="standard DGMs often violate the constraints (some > 95%)",
                       holds=bool(u["violation_rate"] > 0), notes=notes, plots=plots))
      rows.append(dict(paper=PAPER, experiment=exp, metric="violation rate: P- / C- (layer)",
                       ours=max(p["violation_rate"], k["violation_rate"]),
                       paper_value="0% (C-DGMs are never non-compliant)",
                       holds=bool(p["violation_rate"] == 0 and k["violation_rate"] == 0),
                       notes=f"P- {p['violation_rate']:.2%}, C- {k['violation_rate']:.2%}", plots=[]))
      rows.append(dict(paper=PAPER, experiment=exp, metric="utility F1: C- minus unconstrained",
                       ours=k["utility_f1"] - u["utility_f1"],
                       paper_value="C-DGMs improve utility (up to +6.5% with detection, averaged over data sets)",
                       holds=bool(k["utility_f1"] >= u["utility_f1"]) if not fast else None,
                       notes=f"unc {u['utility_f1']:.3f}, P- {p['utility_f1']:.3f}, C- {k['utility_f1']:.3f} "
                             "(one seed, one sampling round: noisy)", plots=[]))
      rows.append(dict(paper=PAPER, experiment=exp, metric="detection F1 (lower better): C- minus unconstrained",
                       ours=k["detection_f1"] - u["detection_f1"],
                       paper_value="C-DGMs are harder to detect (lower detection)",
                       holds=bool(k["detection_f1"] <= u["detection_f1"]) if not fast else None,
                       notes=f"unc {u['detection_f1']:.3f}, P- {p['detection_f1']:.3f}, C- {k['detection_f1']:.3f}; "
                             f"accuracy unc {u['detection_accuracy']:.3f} C- {k['detection_accuracy']:.3f}",
                       plots=[]))
  metrics_lib.write_results(workdir, {"rows": [{k: v for k, v in r.items()} for r in rows]}, "reproduce.json")
  return rows


# --------------------------------------------------------------------------------------------------------------
# benchmark
# --------------------------------------------------------------------------------------------------------------


def _bench_constraint_sets(quick: bool) -> list[tuple[str, Constraints]]:
  sets = [("generated", data_lib.load_generated().constraints)]
  if data_lib.cdgm_data_dir(required=False) is not None:
    for n in ("url", "wids", "heloc", "faults", "botnet"):
      sets.append((n, data_lib.load_named_constraints(n)))
  return sets


def benchmark(quick: bool = True) -> list[dict]:
  """Layer throughput vs constraints/features (schedules, batch sizes, 1 vs all devices), reduction cost, and
  sampling time with vs without the layer."""
  from iclr24_jax.papers.cdgm.constraints import reduce_constraints
  rows = []
  repeats, min_time = (5, 0.3) if quick else (20, 1.0)
  for name, cons in _bench_constraint_sets(quick):
    d = cons.num_variables
    r = bench.time_host(lambda c=cons: reduce_constraints(c), repeats=2, name=f"cdgm/reduce/{name}",
                        size=f"C={cons.num_constraints},D={d}", batch=0, mesh_devices=1)
    st = reduce_constraints(cons).stats
    r.update(active_rows=st["active_rows"], combinations=st["combinations"], pruned=st["pruned_duplicates"] +
             st["pruned_chernikov"], num_constraints=cons.num_constraints, num_features=d)
    rows.append(r)
    for schedule in ("levels", "scan", "sequential"):
      if schedule == "sequential" and name == "botnet" and quick:
        continue  # 252 unrolled steps: long compile on CPU; measured in quick=False
      layer = ConstraintLayer(cons, d, schedule=schedule)
      st = layer.stats
      for n_dev in sorted({1, jax.device_count()}):
        if schedule != "levels" and n_dev > 1:
          continue
        mesh = sharding.make_mesh(devices=jax.devices()[:n_dev])
        for batch in (1024, 16384):
          x = np.random.default_rng(0).normal(0, 10, (batch, d)).astype(np.float32)
          xs = jax.device_put(x, sharding.data_sharding(mesh))
          fn = jax.jit(layer, in_shardings=sharding.data_sharding(mesh), out_shardings=sharding.data_sharding(mesh))
          rows.append(bench.time_fn(fn, xs, repeats=repeats, min_time_s=min_time, items=batch,
                                    name=f"cdgm/layer/{name}/{schedule}", size=f"C={cons.num_constraints},D={d}",
                                    batch=batch, mesh_devices=n_dev, num_constraints=cons.num_constraints,
                                    num_features=d, active_rows=st["active_rows"], levels=st["num_levels"],
                                    steps=st["num_steps"]))
  # Sampling with and without the layer (untrained weights: the cost does not depend on their values).
  from iclr24_jax.configs import cdgm as cfg_mod
  table = data_lib.load_generated()
  tf = tfm.fit_transform(table.train, table.discrete, max_fit_rows=500, max_iter=20)
  layer = ConstraintLayer(table.constraints, table.num_features)
  enc = tfm.encode(tf, table.train)
  for mname in ("tvae", "ctgan"):
    model = build_model(cfg_mod.get_config(f"generated_{mname}"), tf, layer, "postprocessing")
    state = jax.jit(model.init)(jax.random.key(0))
    data = model_data(model, tf, enc)
    for num in (1000, 10000):
      for use in (False, True):
        if mname == "ctgan":
          fn = jax.jit(lambda s, k, u=use, n=num: model.sample(s, k, n, cond_prob=data["cond_prob"], apply_layer=u))
          arg = state
        else:
          fn = jax.jit(lambda p, k, u=use, n=num: model.sample(p, k, n, apply_layer=u))
          arg = state.params
        rows.append(bench.time_fn(fn, arg, jax.random.key(1), repeats=repeats, min_time_s=min_time, items=num,
                                  name=f"cdgm/sample/{mname}/{'with' if use else 'without'}_layer", size=num,
                                  batch=num, mesh_devices=1))
  return rows
