"""Experiments of the conceptual safeguards paper: coverage vs confirmation budget at a target accuracy.

run(config, workdir): trains calibrated concept detectors and the front end, picks the threshold on validation
for each of `config.safeguard.target_accuracies`, and traces test coverage as the confirmation budget grows, for the
variance-greedy and random policies, under the per-concept budget and the official global budget (the same total
number of confirmations in one greedy order over all pairs); baselines: no confirmation, no propagation (hard concepts), and a
selective classifier trained directly on x. Writes metrics.jsonl (detector training), results.json and
coverage_vs_budget.png.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.papers.safeguards import data as sg_data
from iclr24_jax.papers.safeguards import model as sg_model
from iclr24_jax.papers.safeguards import propagation
from iclr24_jax.papers.safeguards import safeguard
from iclr24_jax.vision import classify

# Compiled once per shape (the library functions stay un-jitted; experiments compile them here).
_propagate = jax.jit(propagation.propagate, static_argnames=("method", "num_samples", "front_end_fn", "chunk_size"))
_choose_threshold = jax.jit(safeguard.choose_threshold)
_coverage_accuracy = jax.jit(safeguard.coverage_accuracy)
_front_end = jax.jit(propagation.logistic_front_end)
_fit_calibration = jax.jit(sg_model.fit_calibration, static_argnames=("method", "num_iters"))
_fit_front_end = jax.jit(sg_model.fit_front_end, static_argnames=("num_iters",))


# ----------------------------------------------------------------------------------------------- training
@functools.lru_cache(maxsize=16)
def _forward(model):
  return jax.jit(lambda params, extra, x: classify.apply_model(model, params, extra, x, train=False)[0])


def predict_logits(model, state, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
  """Logits [N, ...] of `model` on x in fixed-size padded batches (one compile per model and input shape)."""
  fwd, n = _forward(model), x.shape[0]
  outs = [np.asarray(fwd(state.params, state.extra, batch["x"]))
          for batch, _ in data_lib.eval_batches({"x": x}, batch_size)]
  return np.concatenate(outs)[:n]


def train_detectors(config: Any, ds: sg_data.ConceptDataset, workdir: str | None, mesh=None, progress: bool = True):
  """Trains the K concept detectors with the shared loop (metrics.jsonl and checkpoints in `workdir`).

  Returns:
    (model, state).
  """
  model = sg_model.create_detector(config.model, ds.num_concepts)
  tx = make_optimizer(config.optimizer, config.num_steps)
  stream = data_lib.BatchStream({"x": ds.train.x, "c": ds.train.c}, config.batch_size, seed=config.seed)
  init_fn = functools.partial(classify.init, model=model, input_shape=ds.input_shape, tx=tx)
  mesh = sharding.make_mesh(config.get("mesh")) if mesh is None else mesh

  def eval_fn(state):
    logits = predict_logits(model, state, ds.val.x)
    c = ds.val.c
    bce = np.mean(np.maximum(logits, 0) - logits * c + np.log1p(np.exp(-np.abs(logits))))
    return {"val_bce": float(bce), "val_concept_accuracy": float(np.mean((logits > 0) == (c > 0.5)))}

  save = workdir is not None and config.get("save_checkpoints", True)
  res = loop_lib.train_loop(init_fn=init_fn, train_step=sg_model.make_detector_train_step(model), batches=stream,
                            num_steps=config.num_steps, key=jax.random.key(config.seed),
                            workdir=workdir if save else None, mesh=mesh, log_every=config.log_every,
                            eval_every=config.eval_every, eval_fn=eval_fn, checkpoint_every=config.checkpoint_every,
                            config=config, progress=progress, name="safeguards/detectors",
                            steps_per_call=int(config.get("steps_per_call", 1)))
  if workdir is not None and not save:   # no checkpoints: still leave the training curve in metrics.jsonl
    writer = metrics_lib.MetricWriter(workdir)
    for row in res.history:
      writer.write(row["step"], {k: v for k, v in row.items() if k != "step"})
  return model, res


def train_selective_baseline(config: Any, ds: sg_data.ConceptDataset, workdir: str | None, progress: bool = True
                             ) -> dict[str, np.ndarray]:
  """The selective classifier on x: a classifier x -> y, Platt-calibrated on validation.

  Returns:
    {'val': [N_val] Pr(y=1|x), 'test': [N_test] Pr(y=1|x)}.
  """
  b = config.baseline
  cfg = ml_collections.ConfigDict(dict(seed=config.seed, model=b.model.to_dict(), optimizer=config.optimizer.to_dict(),
                                       num_steps=b.num_steps, batch_size=config.batch_size,
                                       log_every=config.log_every, eval_every=0, checkpoint_every=0,
                                       mesh=config.mesh.to_dict()))
  dset = data_lib.Dataset(ds.name, data_lib.Split(ds.train.x, ds.train.y), data_lib.Split(ds.val.x, ds.val.y),
                          data_lib.Split(ds.test.x, ds.test.y), num_classes=2)
  save = workdir is not None and config.get("save_checkpoints", True)
  model, res = classify.train_classifier(cfg, dset, workdir=workdir if save else None, progress=progress)

  def margin(x):
    logits = predict_logits(model, res.state, x)
    return (logits[:, 1] - logits[:, 0])[:, None]

  cal = _fit_calibration(margin(ds.val.x), ds.val.y[:, None].astype(np.float32), config.calibration.method)
  return {split: np.asarray(sg_model.calibrated_probs(margin(getattr(ds, split).x), cal))[:, 0]
          for split in ("val", "test")}


# ----------------------------------------------------------------------------------------------- evaluation
@functools.partial(jax.jit, static_argnames=("strategy", "method", "num_samples", "budget_mode"))
def evaluate_budget(concept_probs: jax.Array, true_concepts: jax.Array, y: jax.Array, front_end_params: Any,
                    tau: jax.Array, budget_per_concept: jax.Array, key: jax.Array, strategy: str = "variance",
                    method: str = "exact", num_samples: int = 1000, budget_mode: str = "per_concept"
                    ) -> dict[str, jax.Array]:
  """Coverage/accuracy after confirming concepts on abstained instances under a confirmation budget.

  Args:
    concept_probs: [B, K] calibrated concept probabilities.
    true_concepts: [B, K] the 0/1 values a human would confirm.
    y: [B] labels.
    front_end_params: front end.
    tau: threshold.
    budget_per_concept: [K] (or scalar) counts.
    key: for 'random' and for 'mc'.
    strategy: 'variance' | 'random'.
    method, num_samples: propagation.
    budget_mode: 'per_concept' or 'global' (sum of budget_per_concept in one greedy order; safeguard.confirm).

  Returns:
    dict(coverage, accuracy, num_covered, num_confirmed).
  """
  key_mc, key_confirm = jax.random.split(key)
  y_bar = propagation.propagate(concept_probs, front_end_params, method, key_mc, num_samples)
  abstain = safeguard.abstain_mask(y_bar, tau)
  confirmed = safeguard.confirm(concept_probs, front_end_params, abstain, budget_per_concept, strategy,
                                key_confirm, method, num_samples, budget_mode=budget_mode)
  p_new = safeguard.apply_confirmation(concept_probs, confirmed, true_concepts)
  y_bar_new = propagation.propagate(p_new, front_end_params, method, key_mc, num_samples)
  out = safeguard.coverage_accuracy(y_bar_new, y, tau)
  out["num_confirmed"] = confirmed.sum()
  return out


def coverage_curve(concept_probs: np.ndarray, true_concepts: np.ndarray, y: np.ndarray, front_end_params: Any,
                   tau: float, budget_fractions, num_random_seeds: int = 5, seed: int = 0, method: str = "exact",
                   num_samples: int = 1000, budget_mode: str = "per_concept") -> dict[str, Any]:
  """Coverage and accuracy vs budget (per concept: a fraction of the abstained test instances; 'global': the same
  total number of confirmations, K times that, spent in one greedy order).

  Args:
    concept_probs: [B, K] calibrated test concept probabilities; true_concepts: [B, K]; y: [B].
    front_end_params, tau: the safeguard.
    budget_fractions: budgets as fractions of the abstained test instances (per concept).
    num_random_seeds: draws of the random policy (averaged).
    seed, method, num_samples: keys and propagation.
    budget_mode: 'per_concept' or 'global'.

  Returns:
    {'budget_fraction': [...], 'budget_per_concept': [...], 'budget_mode': str,
     'variance': {'coverage': [...], 'accuracy': [...]},
     'random': {'coverage': [...], 'coverage_std': [...], 'accuracy': [...]}, 'num_abstained': n}.
  """
  y_bar = _propagate(concept_probs, front_end_params, method, jax.random.key(seed), num_samples)
  num_abstained = int(jnp.sum(safeguard.abstain_mask(y_bar, tau)))
  k = concept_probs.shape[1]
  out = {"budget_fraction": [float(b) for b in budget_fractions], "budget_per_concept": [],
         "budget_mode": budget_mode, "variance": {"coverage": [], "accuracy": []},
         "random": {"coverage": [], "coverage_std": [], "accuracy": []}, "num_abstained": num_abstained}
  args = (jnp.asarray(concept_probs), jnp.asarray(true_concepts), jnp.asarray(y), front_end_params, jnp.float32(tau))
  rand_keys = jnp.stack([jax.random.key(1000 + s) for s in range(num_random_seeds)])
  # the random policy's draws in one vmapped call
  random_eval = jax.vmap(evaluate_budget, in_axes=(None, None, None, None, None, None, 0, None, None, None, None))
  for frac in budget_fractions:
    budget = int(round(frac * num_abstained))
    out["budget_per_concept"].append(budget)
    b = jnp.full((k,), budget, jnp.int32)
    r = jax.device_get(evaluate_budget(*args, b, jax.random.key(seed), "variance", method, num_samples, budget_mode))
    out["variance"]["coverage"].append(float(r["coverage"]))
    out["variance"]["accuracy"].append(float(r["accuracy"]))
    r = jax.device_get(random_eval(*args, b, rand_keys, "random", method, num_samples, budget_mode))
    covs, accs = np.asarray(r["coverage"], np.float64), np.asarray(r["accuracy"], np.float64)
    out["random"]["coverage"].append(float(np.mean(covs)))
    out["random"]["coverage_std"].append(float(np.std(covs)))
    out["random"]["accuracy"].append(float(np.nanmean(accs)) if not np.all(np.isnan(accs)) else float("nan"))
  return out


def build_safeguard(config: Any, ds: sg_data.ConceptDataset, workdir: str | None, progress: bool = True
                    ) -> dict[str, Any]:
  """Detectors -> calibration -> front end -> propagated Pr(y | x) on validation and test.

  Returns:
    dict with the detector, its final eval, calibration, calibrated probs {'val', 'test'} [N, K], the front-end
    params, y_bar {'val', 'test'} [N] and the wall time.
  """
  t0 = time.time()
  model, res = train_detectors(config, ds, workdir, progress=progress)
  logits = {s: predict_logits(model, res.state, getattr(ds, s).x) for s in ("val", "test")}
  cal = _fit_calibration(logits["val"], ds.val.c, config.calibration.method)
  probs = {s: np.asarray(sg_model.calibrated_probs(logits[s], cal)) for s in ("val", "test")}
  front = _fit_front_end(ds.train.c, ds.train.y, config.front_end.inverse_c, num_iters=config.front_end.num_iters)
  sc = config.safeguard
  key = jax.random.key(config.seed)
  y_bar = {s: np.asarray(_propagate(probs[s], front, sc.method, key, sc.num_samples)) for s in ("val", "test")}
  return {"detector": model, "detector_state": res.state, "detector_eval": res.final_eval, "calibration": cal,
          "probs": probs, "front_end": front, "y_bar": y_bar, "train_s": time.time() - t0}


def evaluate_target(config: Any, ds: sg_data.ConceptDataset, built: dict, target_accuracy: float,
                    selective_x: dict | None = None) -> dict[str, Any]:
  """Threshold for one target accuracy, the coverage-vs-budget curve, and the baselines at that target."""
  sc = config.safeguard
  probs, front, y_bar = built["probs"], built["front_end"], built["y_bar"]
  tau = float(_choose_threshold(y_bar["val"], ds.val.y, target_accuracy))
  t0 = time.time()
  curve = coverage_curve(probs["test"], ds.test.c, ds.test.y, front, tau, sc.budget_fractions,
                         sc.num_random_seeds, config.seed, sc.method, sc.num_samples)
  curve_global = coverage_curve(probs["test"], ds.test.c, ds.test.y, front, tau, sc.budget_fractions,
                                sc.num_random_seeds, config.seed, sc.method, sc.num_samples, budget_mode="global")
  out = {"target_accuracy": float(target_accuracy), "tau": tau, "curve": curve, "curve_global": curve_global,
         "curve_s": time.time() - t0,
         "val_at_tau": jax.device_get(_coverage_accuracy(y_bar["val"], ds.val.y, tau)),
         "test_at_tau": jax.device_get(_coverage_accuracy(y_bar["test"], ds.test.y, tau))}
  # Baseline: no propagation (predict from the thresholded concepts, threshold chosen the same way).
  hard = {s: np.asarray(_front_end(front, (probs[s] > 0.5).astype(np.float32))) for s in ("val", "test")}
  tau_hard = float(_choose_threshold(hard["val"], ds.val.y, target_accuracy))
  out["no_propagation"] = {"tau": tau_hard, **jax.device_get(_coverage_accuracy(hard["test"], ds.test.y, tau_hard))}
  curve["no_propagation_coverage"] = float(out["no_propagation"]["coverage"])
  # The front end on the true concepts at the same tau (what confirming everything approaches).
  oracle = np.asarray(_front_end(front, ds.test.c.astype(np.float32)))
  out["true_concepts_at_tau"] = jax.device_get(_coverage_accuracy(oracle, ds.test.y, tau))
  if selective_x is not None:
    tau_x = float(_choose_threshold(selective_x["val"], ds.val.y, target_accuracy))
    out["selective_x"] = {"tau": tau_x, **jax.device_get(_coverage_accuracy(selective_x["test"], ds.test.y, tau_x))}
    curve["selective_x_coverage"] = float(out["selective_x"]["coverage"])
  return out


def _concept_metrics(probs: np.ndarray, c: np.ndarray) -> dict[str, float]:
  p = np.clip(probs, 1e-7, 1 - 1e-7)
  bce = -np.mean(c * np.log(p) + (1 - c) * np.log(1 - p))
  # expected calibration error, 10 equal-width bins over all concepts
  bins = np.minimum((p * 10).astype(int), 9).ravel()
  ece = sum(abs(p.ravel()[bins == i].mean() - c.ravel()[bins == i].mean()) * np.mean(bins == i)
            for i in range(10) if np.any(bins == i))
  return {"concept_accuracy": float(np.mean((p > 0.5) == (c > 0.5))), "concept_bce": float(bce),
          "concept_ece": float(ece)}


def plot_coverage(curves: dict[str, dict], path: str) -> str:
  """Coverage vs confirmation budget, one panel per (data set, target accuracy).

  Args:
    curves: title -> a `coverage_curve` dict (optionally with 'global': the global-budget curve).
    path: PNG path.

  Returns:
    The path written.
  """
  n = len(curves)
  ncols = min(n, 2)
  fig, axes = metrics_lib.new_figure(ncols=ncols, nrows=-(-n // ncols), size=(4.8, 3.6))
  for ax in axes.flat[n:]:
    ax.axis("off")
  for ax, (title, cv) in zip(axes.flat, curves.items()):
    xs = 100 * np.asarray(cv["budget_fraction"])
    ax.plot(xs, cv["variance"]["coverage"], "o-", label="variance-greedy confirmation")
    rc, rs = np.asarray(cv["random"]["coverage"]), np.asarray(cv["random"]["coverage_std"])
    if "global" in cv:
      ax.plot(xs, cv["global"]["variance"]["coverage"], "^--", color="C2",
              label="variance-greedy, global budget (official)")
    ax.plot(xs, rc, "s-", label="random confirmation (mean, +-1 sd)")
    ax.fill_between(xs, rc - rs, rc + rs, alpha=0.2, color="C1")
    ax.axhline(cv["variance"]["coverage"][0], color="gray", ls="--", label="no confirmation")
    if "no_propagation_coverage" in cv:
      ax.axhline(cv["no_propagation_coverage"], color="C3", ls=":", label="no propagation (hard concepts)")
    if "selective_x_coverage" in cv:
      ax.axhline(cv["selective_x_coverage"], color="k", ls="-.", label="selective classifier on x")
    ax.set_xlabel("budget per concept (% of abstained instances)")
    ax.set_ylabel("test coverage")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, 1.05)
  handles, labels = axes.flat[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, bbox_to_anchor=(0.5, -0.06))
  fig.tight_layout()
  return metrics_lib.save_figure(fig, path)


def run(config: Any, workdir: str, progress: bool = True) -> dict:
  """Builds a safeguard on config.data and traces coverage vs confirmation budget; see module docstring.

  Returns:
    results (also in workdir/results.json): the first target accuracy's numbers at the top level (tau, curve,
    val_at_tau, test_at_tau, no_propagation, true_concepts_at_tau, selective_x) and every target under 'targets'.
  """
  os.makedirs(workdir, exist_ok=True)
  ds = sg_data.load_concept_dataset(config.data)
  sc = config.safeguard
  targets = tuple(float(t) for t in sc.target_accuracies)
  if not targets or any(not 0.5 < t <= 1.0 for t in targets):
    raise ValueError(f"safeguard.target_accuracies {targets} must be non-empty values in (0.5, 1].")
  built = build_safeguard(config, ds, workdir, progress=progress)
  selective_x = None
  if config.baseline.get("enabled", True):
    selective_x = train_selective_baseline(config, ds, os.path.join(workdir, "selective_x"), progress=progress)
  per_target = {f"{t:g}": evaluate_target(config, ds, built, t, selective_x) for t in targets}
  main = per_target[f"{targets[0]:g}"]
  results = {
      "data": {"name": ds.name, "train": len(ds.train), "val": len(ds.val), "test": len(ds.test),
               "concepts": list(ds.concept_names)},
      "front_end": jax.device_get(built["front_end"]), "detector_eval": built["detector_eval"],
      "test_concepts": _concept_metrics(built["probs"]["test"], ds.test.c), "train_s": built["train_s"],
      **main, "targets": per_target,
  }
  if jax.process_index() == 0:
    results["plot"] = plot_coverage({f"{ds.name}, target accuracy {t}": {**r["curve"], "global": r["curve_global"]}
                                     for t, r in per_target.items()},
                            os.path.join(workdir, "coverage_vs_budget.png"))
  metrics_lib.write_results(workdir, results)
  return results
