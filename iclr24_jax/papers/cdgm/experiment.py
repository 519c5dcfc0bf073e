"""cdgm experiment: `run` (one (C-)DGM on a table: train, sample, evaluate, write results and plots) and the
building blocks the study shares (model construction, sampling, evaluation).

The reproduction (unconstrained vs P- vs C- on three tables, 3 seeds, and the fair test on HELOC with the official
TVAE recipe) and the layer benchmark are in `study.py`. Training uses `train.fit` / `train.fit_seeds` rather than
`common.loop.train_loop`; `train`'s docstring says why."""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
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
  table = data_lib.load(config.data)   # generated, or the paper's tables (DataNotFoundError when absent)
  tf = tfm.fit_transform(table.train, table.discrete, max_clusters=int(config.data.max_clusters),
                         seed=int(config.seed), max_fit_rows=config.data.get("gmm_fit_rows") or None,
                         max_iter=int(config.data.get("gmm_max_iter", 100)))
  return table, tf, tfm.encode(tf, table.train, seed=int(config.seed))


def ordered(constraints: Constraints, how: str, seed: int, real=None, synthetic=None) -> Constraints:
  """The constraints with the variable ordering `how` names.

  Args:
    constraints: the parsed constraints (their own 'given' ordering).
    how: 'given', 'random' (seeded) or 'corr' (the paper's correlation heuristic).
    seed: seed of the random ordering.
    real: [N, D] real rows ('corr' only).
    synthetic: [M, D] samples of an unconstrained model ('corr' only).
  """
  if how == "given":
    return constraints
  if how == "random":
    return orderings.random_ordering(constraints, seed)
  if how == "corr":
    if synthetic is None:
      raise ValueError("the 'corr' ordering needs samples of the unconstrained model.")
    return orderings.correlation_ordering(constraints, real, synthetic)
  raise ValueError(f"unknown constraints.ordering '{how}'; choose 'given', 'random' or 'corr'.")


def evaluate_rows(table: data_lib.Table, rows: np.ndarray, seed: int, integer_cast: str = "round",
                  groups: dict[str, np.ndarray] | None = None) -> dict:
  """Violation rate (on the raw rows), utility F1 and detection F1/accuracy (on rows cast to the training dtypes).

  Args:
    table: the table (test rows, label, integer columns, constraints).
    rows: [N, D] synthetic rows.
    seed: classifier seed.
    integer_cast: how integer columns are cast before utility/detection: 'round' (default), 'trunc' (the official
      `prepare_gen_data`, whose `astype(X_train.dtypes)` truncates toward zero, e.g. 0.99 -> 0 for a 0/1 column)
      or 'none'.
    groups: optional {name: [N] bool} masks over `rows`: detection is also reported per group
      ('detected_<name>', see `evaluation.detection`).

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
  det = evaluation.detection(table.train, cast, seed, groups=groups)
  return {"violation_rate": float(violation_rate(rows, table.constraints)), "utility_f1": util["f1"],
          "detection_f1": det["f1"], "detection_accuracy": det["accuracy"], "utility": util, "detection": det}


def plot_pair(table: data_lib.Table, samples: dict[str, np.ndarray], path: str) -> str | None:
  """Scatter of the first two-variable constraint's variables: real vs each sample set.

  Args:
    table: the table (its constraints pick the pair; its train rows are the 'real' panel).
    samples: {label: [M, D] rows}, one panel each.
    path: PNG path.

  Returns:
    The path, or None when no constraint has exactly two variables.
  """
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
    res = train_lib.fit(pre, pre_data, int(config.num_steps), key_pre, int(config.log_every),
                        workdir=os.path.join(workdir, "pretrain"), name="pretrain", config=config,
                        **loop_lib.checkpoint_options(config))
    synth = sample_rows(pre, res.state, pre_data, key_sample, len(table.train), apply_layer=False)
    constraints = ordered(constraints, "corr", seed, table.train, synth)
  else:
    constraints = ordered(constraints, config.constraints.ordering, seed)
  layer = ConstraintLayer(constraints, table.num_features, epsilon=float(config.constraints.epsilon),
                          schedule=config.constraints.schedule)
  model = build_model(config, tf, layer, version)
  data = model_data(model, tf, enc)
  res = train_lib.fit(model, data, int(config.num_steps), key_train, int(config.log_every), workdir=workdir,
                      progress=True, name="train", config=config, **loop_lib.checkpoint_options(config))
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
    plot_pair(table, {"before layer": raw, f"{version}": final}, os.path.join(workdir, "constraint_pair.png"))
  return results


# --------------------------------------------------------------------------------------------------------------
# reproduce
# --------------------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------------------
# benchmark
# --------------------------------------------------------------------------------------------------------------
