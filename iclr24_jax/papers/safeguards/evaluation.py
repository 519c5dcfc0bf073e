"""The safeguard's evaluation: coverage and accuracy as the confirmation budget grows.

`evaluate_budget` (one budget: abstain, confirm concepts by a policy, re-propagate), `coverage_curve` (coverage vs
budget for the variance-greedy and random policies, per-concept or global budget) and `evaluate_target` (the
threshold for one target accuracy, the curves and the baselines). Built on `train.build_safeguard`.
"""
from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers.safeguards import data as sg_data
from iclr24_jax.papers.safeguards import propagation
from iclr24_jax.papers.safeguards import safeguard
from iclr24_jax.papers.safeguards.train import propagate_compiled

# Compiled once per shape.
_choose_threshold = jax.jit(safeguard.choose_threshold)
_coverage_accuracy = jax.jit(safeguard.coverage_accuracy)
_front_end = jax.jit(propagation.logistic_front_end)


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
  y_bar = propagate_compiled(concept_probs, front_end_params, method, jax.random.key(seed), num_samples)
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
