"""The compositional preference model: pooled standardisation, a logistic fit on feature differences, the
reward, preference probabilities, cross-validation over (penalty, C) and best-of-n selection.

Official reference: dongyoung-go/CPM `mle-train/fit_logistic.py` (`train_model_g`, the variant of every run in
`logistic_fits.sh`) and `feature_extract/reward_scaling_lll.py` (best-of-n).

  mu, sigma  = mean / std of the features of A and B pooled (std + 1e-7)              (train_model_g)
  x_i        = (f(A_i) - mu) / sigma - (f(B_i) - mu) / sigma                          (Eq. 2 of the paper)
  w          = argmin  pen(w) + C sum_i log(1 + exp(-y_i x_i . w)),  y_i = +-1, no intercept
               pen = ||w||_1 (L1) or ||w||^2 / 2 (L2)  -- scikit-learn's LogisticRegression objective
  R(y)       = sum_k w_k (f_k(y) - mu_k) / sigma_k                                     (Eq. 3)
  P(A > B)   = sigmoid(R(A) - R(B))                                                    (Eq. 1, Bradley-Terry)

All functions are pure JAX (jit / vmap over C, folds or seeds); `fit` solves L2 by L-BFGS (optax) and L1 by
FISTA with soft-thresholding and adaptive restart.
"""
from __future__ import annotations

import functools
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import checks

PENALTIES = ("l1", "l2")
STD_EPS = 1e-7          # official: feature_stds = std(0) + 1e-7
OFFICIAL_CS = tuple(np.logspace(-5, 5, 12).tolist())   # official GridSearchCV grid, cv=8, scoring='accuracy'


@flax.struct.dataclass
class Model:
  """A fitted CPM (a pytree: vmap/jit-friendly).

  Attributes:
    weights: [F] coefficients w on standardised features.
    mean: [F] pooled feature means mu.
    std: [F] pooled feature standard deviations sigma (+1e-7).
    C: [] inverse regularisation strength used.
    penalty: 'l1' or 'l2' (static).
  """
  weights: jax.Array
  mean: jax.Array
  std: jax.Array
  C: jax.Array
  penalty: str = flax.struct.field(pytree_node=False, default="l2")


def _check_pairs(features_a, features_b, labels=None, where: str = "cpm"):
  # Structure only (shapes, dtypes, a non-empty batch); the values are `_pair_values`' job.
  checks.shapes(where, features_a=(features_a, "N F"), features_b=(features_b, "N F"), labels=(labels, "N"))
  checks.dtype(where, "features_a", features_a, "real")
  checks.dtype(where, "features_b", features_b, "real")
  checks.nonempty(where, "features_a", np.shape(features_a)[0], "pairs")
  fa, fb = jnp.asarray(features_a), jnp.asarray(features_b)
  return fa.astype(jnp.float32), fb.astype(jnp.float32)


def _check_labels(where: str, labels) -> object:
  checks.dtype(where, "labels", labels, "real", "labels are 1 where A is preferred, 0 where B is.")
  return checks.labels_in(where, "labels", labels, (0, 1),
                          "1 where A is preferred, 0 where B is (the official 0/1 convention); {-1, +1} labels "
                          "are rejected rather than silently read as 0/1: pass (labels + 1) // 2.")


def _pair_values(where: str, features_a, features_b, labels=None) -> object:
  # NaN features (an unparseable score) and labels outside {0, 1}: named errors eagerly, NaN under jit.
  hint = "a missing feature score; drop those pairs first (cpm.complete_pairs) as the official code does."
  oks = [checks.finite(where, "features_a", features_a, hint), checks.finite(where, "features_b", features_b, hint)]
  if labels is not None:
    oks.append(_check_labels(where, labels))
  return checks.all_ok(*oks)


def _check_C(where: str, C) -> object:
  return checks.in_range(where, "C", C, 0.0, None, low_open=True,
                         hint="C is scikit-learn's inverse regularisation strength (> 0).")


def standardization(features_a: jax.Array, features_b: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Feature means and standard deviations pooled over the A and B replies (official `train_model_g`).

  Args:
    features_a: [N, F] features of the first replies.
    features_b: [N, F] features of the second replies.

  Returns:
    (mean [F], std [F]) over the 2N rows; std is the population std plus 1e-7 (NaN under jit for non-finite
    features; eager calls raise).
  """
  where = "cpm.standardization"
  fa, fb = _check_pairs(features_a, features_b, where=where)
  ok = _pair_values(where, features_a, features_b)
  pooled = jnp.concatenate([fa, fb], axis=0)
  return checks.poison((pooled.mean(0), pooled.std(0) + STD_EPS), ok)


def pair_differences(features_a: jax.Array, features_b: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
  """x = z(A) - z(B) with z(f) = (f - mean) / std (Eq. 2).

  Args:
    features_a, features_b: [N, F].
    mean, std: [F].

  Returns:
    [N, F] float32.
  """
  checks.shapes("cpm.pair_differences", features_a=(features_a, "... F"), features_b=(features_b, "... F"),
                mean=(mean, "F"), std=(std, "F"))
  fa, fb = jnp.asarray(features_a, jnp.float32), jnp.asarray(features_b, jnp.float32)
  return (fa - mean) / std - (fb - mean) / std


def logistic_objective(weights: jax.Array, x: jax.Array, labels: jax.Array, C: jax.Array | float,
                       penalty: str = "l2", sample_weight: jax.Array | None = None) -> jax.Array:
  """scikit-learn's objective for LogisticRegression(fit_intercept=False).

  L2: ||w||^2 / 2 + C sum_i log(1 + exp(-y_i x_i . w));  L1: ||w||_1 + C sum_i (same), y = 2 label - 1.

  Args:
    weights: [F].
    x: [N, F] pair differences.
    labels: [N] in {0, 1}.
    C: inverse regularisation strength.
    penalty: 'l1' or 'l2'.
    sample_weight: [N] optional 0/1 (or real) weights of the rows (used for cross-validation folds).

  Returns:
    [] the objective value (NaN under jit for labels outside {0, 1} or C <= 0; eager calls raise).
  """
  where = "cpm.logistic_objective"
  checks.shapes(where, weights=(weights, "F"), x=(x, "N F"), labels=(labels, "N"), sample_weight=(sample_weight, "N"))
  checks.choice(where, "penalty", penalty, PENALTIES)
  ok = checks.all_ok(_check_labels(where, labels), _check_C(where, C))
  sign = 2.0 * jnp.asarray(labels, jnp.float32) - 1.0
  loss = jax.nn.softplus(-sign * (x @ weights))
  if sample_weight is not None:
    loss = loss * sample_weight
  reg = 0.5 * jnp.sum(weights ** 2) if penalty == "l2" else jnp.sum(jnp.abs(weights))
  return checks.poison(reg + C * jnp.sum(loss), ok)


def _scaled_smooth(weights, x, sign, C, sample_weight, l2: bool):
  # The objective divided by C * n (same minimiser; values O(1) for the line search and tolerances).
  n = jnp.maximum(jnp.sum(sample_weight), 1.0)
  data = jnp.sum(sample_weight * jax.nn.softplus(-sign * (x @ weights))) / n
  if l2:
    return data + 0.5 * jnp.sum(weights ** 2) / (C * n)
  return data


def _solve_l2(x, sign, C, sample_weight, max_iter: int, tol: float, w0):
  f = functools.partial(_scaled_smooth, x=x, sign=sign, C=C, sample_weight=sample_weight, l2=True)
  opt = optax.lbfgs(memory_size=20)
  value_and_grad = optax.value_and_grad_from_state(f)

  def cond(carry):
    _, _, k, gnorm = carry
    return (k < max_iter) & (gnorm > tol)

  def body(carry):
    w, state, k, _ = carry
    value, grad = value_and_grad(w, state=state)
    updates, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=f)
    w = optax.apply_updates(w, updates)
    return w, state, k + 1, jnp.max(jnp.abs(jax.grad(f)(w)))

  w, _, iters, _ = jax.lax.while_loop(cond, body, (w0, opt.init(w0), jnp.zeros((), jnp.int32),
                                                   jnp.asarray(jnp.inf, jnp.float32)))
  return w, iters


def _solve_l1(x, sign, C, sample_weight, max_iter: int, tol: float, w0):
  # FISTA (Beck & Teboulle 2009) with gradient-based adaptive restart (O'Donoghue & Candes 2015) on
  # mean logistic loss + ||w||_1 / (C n). The smooth part's gradient is L-Lipschitz with
  # L = sigma_max(X_w)^2 / (4 n), X_w the rows scaled by sqrt(sample_weight).
  n = jnp.maximum(jnp.sum(sample_weight), 1.0)
  xw = x * jnp.sqrt(sample_weight)[:, None]
  lipschitz = jnp.linalg.norm(xw, ord=2) ** 2 / (4.0 * n) + 1e-12
  step = 1.0 / lipschitz
  thresh = step / (C * n)
  grad_f = jax.grad(functools.partial(_scaled_smooth, x=x, sign=sign, C=C, sample_weight=sample_weight, l2=False))

  def cond(carry):
    _, _, _, k, delta = carry
    return (k < max_iter) & (delta > tol)

  def body(carry):
    w, v, t, k, _ = carry
    u = v - step * grad_f(v)
    w_new = jnp.sign(u) * jnp.maximum(jnp.abs(u) - thresh, 0.0)    # prox of the L1 term: soft-threshold
    t_new = 0.5 * (1.0 + jnp.sqrt(1.0 + 4.0 * t * t))
    restart = jnp.dot(v - w_new, w_new - w) > 0.0                   # momentum points uphill: restart
    t_new = jnp.where(restart, 1.0, t_new)
    mom = jnp.where(restart, 0.0, (t - 1.0) / t_new)
    v_new = w_new + mom * (w_new - w)
    delta = jnp.max(jnp.abs(w_new - w)) / jnp.maximum(jnp.max(jnp.abs(w_new)), 1.0)
    return w_new, v_new, t_new, k + 1, delta

  w, _, _, iters, _ = jax.lax.while_loop(
      cond, body, (w0, w0, jnp.ones((), jnp.float32), jnp.zeros((), jnp.int32), jnp.asarray(jnp.inf, jnp.float32)))
  return w, iters


def fit_differences(x: jax.Array, labels: jax.Array, penalty: str = "l2", C: float | jax.Array = 1.0,
                    sample_weight: jax.Array | None = None, max_iter: int | None = None,
                    tol: float | None = None, init: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Minimises `logistic_objective` over w for given pair differences (no intercept).

  Args:
    x: [N, F] standardised pair differences.
    labels: [N] in {0, 1} (1: the first reply is preferred).
    penalty: 'l2' (L-BFGS, optax) or 'l1' (FISTA with soft-thresholding).
    C: inverse regularisation strength (scikit-learn's C: it multiplies the summed log-loss).
    sample_weight: [N] optional row weights (0/1 masks select cross-validation folds).
    max_iter: iteration cap (default 500 for L2, 20000 for L1).
    tol: stopping tolerance (L2: max |gradient| of the objective / (C n); L1: relative max |w change|).
    init: [F] starting point (default zeros; a warm start from a nearby C speeds up a regularisation path).

  Returns:
    (weights [F], iterations []); NaN weights under jit for labels outside {0, 1}, C <= 0 or non-finite x
    (eager calls raise).
  """
  where = "cpm.fit_differences"
  checks.choice(where, "penalty", penalty, PENALTIES)
  checks.shapes(where, x=(x, "N F"), labels=(labels, "N"), sample_weight=(sample_weight, "N"), init=(init, "F"))
  ok = checks.all_ok(checks.finite(where, "x", x), _check_labels(where, labels), _check_C(where, C))
  x = jnp.asarray(x, jnp.float32)
  sign = 2.0 * jnp.asarray(labels, jnp.float32) - 1.0
  sw = jnp.ones(x.shape[0], jnp.float32) if sample_weight is None else jnp.asarray(sample_weight, jnp.float32)
  C = jnp.asarray(C, jnp.float32)
  w0 = jnp.zeros(x.shape[1], jnp.float32) if init is None else jnp.asarray(init, jnp.float32)
  if penalty == "l2":
    return checks.poison(_solve_l2(x, sign, C, sw, max_iter or 500, 1e-7 if tol is None else tol, w0), ok)
  return checks.poison(_solve_l1(x, sign, C, sw, max_iter or 20000, 1e-8 if tol is None else tol, w0), ok)


def fit(features_a: jax.Array, features_b: jax.Array, labels: jax.Array, penalty: str = "l2",
        C: float | jax.Array = 1.0, max_iter: int | None = None, tol: float | None = None) -> Model:
  """Fits a CPM: pooled standardisation, then logistic regression on z(A) - z(B) without intercept.

  Compile it once for repeated fits (penalty, max_iter and tol are static; C may be traced):

    fit = jax.jit(cpm.fit, static_argnames=("penalty", "max_iter", "tol"))
    model = fit(features_a, features_b, labels, C=1.0)

  Args:
    features_a: [N, F] feature scores of the first replies (no NaN: drop incomplete pairs first).
    features_b: [N, F] feature scores of the second replies.
    labels: [N] 1 where A is preferred, 0 where B is ({-1, +1} labels are rejected: pass (labels + 1) // 2).
    penalty: 'l1' or 'l2'.
    C: scikit-learn's inverse regularisation strength (> 0).
    max_iter, tol: solver settings (see `fit_differences`).

  Returns:
    A `Model` (weights, mean, std, C, penalty). Eagerly, NaN features, labels outside {0, 1} and C <= 0 raise
    named errors (`common.checks`); under jit / vmap the model's arrays are NaN instead.
  """
  where = "cpm.fit"
  checks.choice(where, "penalty", penalty, PENALTIES)
  fa, fb = _check_pairs(features_a, features_b, labels, where=where)
  ok = checks.all_ok(_pair_values(where, features_a, features_b, labels), _check_C(where, C))
  mean, std = standardization(fa, fb)
  x = pair_differences(fa, fb, mean, std)
  w, _ = fit_differences(x, labels, penalty, C, max_iter=max_iter, tol=tol)
  return checks.poison(Model(weights=w, mean=mean, std=std, C=jnp.asarray(C, jnp.float32), penalty=penalty), ok)


def reward(model: Model, features: jax.Array) -> jax.Array:
  """R(y) = sum_k w_k (f_k(y) - mu_k) / sigma_k (Eq. 3).

  Args:
    model: a fitted Model with F weights.
    features: [M, F] (or [..., F]) feature scores.

  Returns:
    [M] (or [...]) rewards; NaN rows stay NaN (a missing feature score has no reward).
  """
  where = "cpm.reward"
  checks.shapes(where, weights=(model.weights, "F"), features=(features, "... F"))
  f = jnp.asarray(features, jnp.float32)
  return ((f - model.mean) / model.std) @ model.weights


def preference_prob(model: Model, features_a: jax.Array, features_b: jax.Array) -> jax.Array:
  """P(A > B) = sigmoid(R(A) - R(B)) (Bradley-Terry, Eq. 1).

  Args:
    model: a fitted Model.
    features_a, features_b: [N, F].

  Returns:
    [N] probabilities.
  """
  return jax.nn.sigmoid(reward(model, features_a) - reward(model, features_b))


def accuracy(model: Model, features_a: jax.Array, features_b: jax.Array, labels: jax.Array) -> jax.Array:
  """Fraction of pairs whose preferred reply gets the higher reward (ties count one half).

  Args:
    model: a fitted Model.
    features_a, features_b: [N, F].
    labels: [N] in {0, 1}.

  Returns:
    [] accuracy (NaN under jit for labels outside {0, 1}; eager calls raise).
  """
  return jnp.mean(pair_correct(model, features_a, features_b, labels))


def pair_correct(model: Model, features_a: jax.Array, features_b: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-pair correctness: 1 if the preferred reply gets the higher reward, 0.5 on a tie, else 0.

  Args:
    model: the fitted reward Model (linear in the features).
    features_a: [N, F] features of reply A.
    features_b: [N, F] features of reply B.
    labels: [N] in {0, 1}, 1 when A is preferred.

  Returns:
    [N] float32 (NaN for NaN features, and under jit for labels outside {0, 1}; eager calls raise).
  """
  where = "cpm.pair_correct"
  checks.shapes(where, features_a=(features_a, "N F"), features_b=(features_b, "N F"), labels=(labels, "N"))
  ok = _check_labels(where, labels)
  margin = reward(model, features_a) - reward(model, features_b)
  sign = 2.0 * jnp.asarray(labels, jnp.float32) - 1.0
  out = jnp.where(margin == 0, 0.5, (sign * margin > 0).astype(jnp.float32))
  return checks.poison(jnp.where(jnp.isnan(margin), jnp.nan, out), ok)


def fold_ids(num_items: int, num_folds: int, seed: int = 0) -> np.ndarray:
  """Random fold assignment of `num_items` rows into `num_folds` near-equal folds.

  Args:
    num_items: N rows.
    num_folds: K in [2, N].
    seed: permutation seed.

  Returns:
    [num_items] int32 fold index.

  Raises:
    ValueError: K outside [2, N].
  """
  if num_folds < 2 or num_folds > num_items:
    raise ValueError(f"num_folds must be in [2, {num_items}], got {num_folds}.")
  perm = np.random.default_rng(seed).permutation(num_items)
  ids = np.empty(num_items, np.int32)
  ids[perm] = np.arange(num_items) % num_folds
  return ids


@functools.partial(jax.jit, static_argnames=("penalty", "num_folds"))
def _cv_program(x, labels, valid, folds, Cs, penalty: str, num_folds: int):
  # One program per (rows, F, penalty, folds, grid size): every (C, fold) fit plus the refit on all rows
  # (fold index num_folds holds nothing out). Folds are vmapped; the C grid (ascending) is a scan whose fits
  # start from the previous C's solution (a warm-started regularisation path: the weakly regularised,
  # slowly converging problems start next to their answer). Padded rows have valid = 0 and weight 0.
  sign = 2.0 * labels.astype(jnp.float32) - 1.0
  ks = jnp.arange(num_folds + 1)
  train = ((folds[None, :] != ks[:, None]) & valid[None, :]).astype(jnp.float32)     # [K+1, N]
  test = ((folds[None, :] == ks[:, None]) & valid[None, :]).astype(jnp.float32)

  def step(w_prev, C):
    w, _ = jax.vmap(lambda sw, w0: fit_differences(x, labels, penalty, C, sample_weight=sw, init=w0))(train, w_prev)
    margin = w @ x.T                                                                     # [K+1, N]
    correct = jnp.where(margin == 0, 0.5, (sign[None] * margin > 0).astype(jnp.float32))
    acc = jnp.sum(correct * test, axis=1) / jnp.maximum(jnp.sum(test, axis=1), 1.0)
    return w, (acc, w)

  w_init = jnp.zeros((num_folds + 1, x.shape[1]), jnp.float32)
  _, (acc, w) = jax.lax.scan(step, w_init, Cs)                                          # [C, K+1], [C, K+1, F]
  return acc[:, :num_folds], w[:, num_folds]


def _cv_compiled(x, labels, valid, folds, Cs, penalty: str, num_folds: int):
  order = np.argsort(np.asarray(Cs), kind="stable")          # the path runs from strong to weak penalties
  acc, w = _cv_program(x, labels, valid, folds, jnp.asarray(np.asarray(Cs)[order]), penalty, num_folds)
  inv = np.argsort(order)
  return np.asarray(acc)[inv], np.asarray(w)[inv]


def _pad_rows(n: int, multiple: int) -> int:
  return int(multiple * max(1, -(-n // multiple)))


def cross_validate(features_a: jax.Array, features_b: jax.Array, labels: jax.Array,
                   penalties: Sequence[str] = PENALTIES, Cs: Sequence[float] = OFFICIAL_CS, num_folds: int = 8,
                   seed: int = 0, pad_rows: int = 64) -> tuple[Model, dict]:
  """Chooses (penalty, C) by k-fold cross-validated accuracy and refits on all pairs (official grid search:
  penalty in {l1, l2}, C in logspace(-5, 5, 12), cv=8, scoring='accuracy').

  Standardisation uses all the given pairs before the folds are split, as the official `train_model_g` does.
  All (C, fold) fits and the refits run in one compiled program per penalty; rows are padded (with zero
  weight) to a multiple of `pad_rows`, so data sets of similar size share the program.

  Args:
    features_a, features_b: [N, F] (no NaN).
    labels: [N] in {0, 1}.
    penalties: penalties searched.
    Cs: C grid.
    num_folds: folds.
    seed: fold assignment seed.
    pad_rows: row padding multiple (compile sharing); the result does not depend on it.

  Returns:
    (model refitted with the best setting, {'penalty', 'C', 'cv_accuracy', 'table': {penalty: [len(Cs)]}}).
    Ties go to the smaller C (stronger regularisation), then to the earlier penalty in `penalties`.
  """
  where = "cpm.cross_validate"
  fa, fb = _check_pairs(features_a, features_b, labels, where=where)
  for pen in penalties:
    checks.choice(where, "penalties", pen, PENALTIES, "penalty")
  for c in Cs:
    _check_C(where, float(c))
  checks.static_int(where, "num_folds", num_folds, low=2, high=np.shape(features_a)[0])
  labels = checks.host_array(where, "labels", labels)
  _pair_values(where, checks.host_array(where, "features_a", features_a),
               checks.host_array(where, "features_b", features_b), labels)
  mean, std = standardization(fa, fb)
  x = np.asarray(pair_differences(fa, fb, mean, std))
  n, f = x.shape
  rows = _pad_rows(n, pad_rows)
  xp = np.zeros((rows, f), np.float32)
  xp[:n] = x
  yp = np.zeros(rows, np.int32)
  yp[:n] = np.asarray(labels)
  valid = np.arange(rows) < n
  folds = np.full(rows, -1, np.int32)
  folds[:n] = fold_ids(n, num_folds, seed)
  grid = np.asarray(list(Cs), np.float32)
  table, refits, best = {}, {}, None
  for pi, pen in enumerate(penalties):
    acc, w = _cv_compiled(xp, yp, valid, folds, grid, pen, num_folds)
    acc = np.asarray(acc).mean(1)
    table[pen], refits[pen] = acc, np.asarray(w)
    for j, a in enumerate(acc):
      key = (round(float(a), 9), -j, -pi)
      if best is None or key > best[0]:
        best = (key, pen, j, float(a))
  _, pen, j, acc = best
  model = Model(weights=jnp.asarray(refits[pen][j]), mean=mean, std=std, C=jnp.asarray(Cs[j], jnp.float32),
                penalty=pen)
  return model, {"penalty": pen, "C": float(Cs[j]), "cv_accuracy": acc, "table": table}


def single_feature_correct(features_a: jax.Array, features_b: jax.Array, labels: jax.Array,
                           test_a: jax.Array, test_b: jax.Array, test_labels: jax.Array) -> np.ndarray:
  """Held-out correctness of each feature used alone, oriented on the training pairs.

  A one-feature logistic fit without intercept (any penalty, any C > 0) has the sign of sum_i y_i x_i (the
  objective is convex in the scalar w and its slope at w = 0 is -C/2 sum_i y_i x_i), and a pair's prediction
  depends only on that sign, so no fit is run.

  Args:
    features_a, features_b: [N, F] training pairs; labels: [N].
    test_a, test_b: [M, F] test pairs; test_labels: [M].

  Returns:
    [F, M] per-feature, per-test-pair correctness (1, 0, or 0.5 on a tie or an uninformative feature).
  """
  sign = 2.0 * np.asarray(labels, np.float64) - 1.0
  d_train = np.asarray(features_a, np.float64) - np.asarray(features_b, np.float64)
  orient = np.sign(sign @ d_train)                                   # [F]
  margin = (np.asarray(test_a, np.float64) - np.asarray(test_b, np.float64)) * orient   # [M, F]
  ts = 2.0 * np.asarray(test_labels, np.float64) - 1.0
  return np.where(margin == 0, 0.5, (ts[:, None] * margin > 0).astype(np.float64)).T


def complete_pairs(features_a: np.ndarray, features_b: np.ndarray) -> np.ndarray:
  """Which pairs have every feature of both replies (unparseable scores are NaN; the official code drops
  rows with a missing feature, `dropna`).

  Args:
    features_a, features_b: [N, F] with NaN for missing.

  Returns:
    [N] bool mask of complete pairs.
  """
  fa, fb = np.asarray(features_a, np.float64), np.asarray(features_b, np.float64)
  return ~(np.isnan(fa).any(1) | np.isnan(fb).any(1))


def best_of_n(rewards_pick: jax.Array, rewards_eval: jax.Array) -> jax.Array:
  """Best-of-n: per prompt, the sample with the highest `rewards_pick`, scored by `rewards_eval`.

  Args:
    rewards_pick: [P, n] rewards of n samples per prompt under the model used for the argmax (PM A).
    rewards_eval: [P, n] rewards of the same samples under the evaluating model (PM B, or a true reward).

  Returns:
    [P] `rewards_eval` of each prompt's picked sample (the first maximum on ties).
  """
  checks.shapes("cpm.best_of_n", rewards_pick=(rewards_pick, "P n"), rewards_eval=(rewards_eval, "P n"))
  rp, re = jnp.asarray(rewards_pick), jnp.asarray(rewards_eval)
  pick = jnp.argmax(rp, axis=1)
  return jnp.take_along_axis(re, pick[:, None], axis=1)[:, 0]


def best_of_n_curve(rewards_pick: jax.Array, rewards_eval: jax.Array,
                    ns: Sequence[int] = (1, 2, 4, 8, 16)) -> dict[str, np.ndarray]:
  """The over-optimisation curve: for each n, best-of-the-first-n picked by A and scored by A and by B.

  Official: `reward_scaling_lll.best_of_n` (n in 1, 2, 4, 8, 16, the first n samples of each prompt).

  Args:
    rewards_pick: [P, N] rewards under PM A.
    rewards_eval: [P, N] rewards under PM B (N >= max(ns)).
    ns: sample counts.

  Returns:
    {'n': [K], 'score_a': [K] mean over prompts of A's reward of A's pick, 'score_b': [K] B's reward of A's
      pick, 'agreement': [K] fraction of prompts where A and B pick the same sample}.
  """
  rp, re = jnp.asarray(rewards_pick), jnp.asarray(rewards_eval)
  if max(ns) > rp.shape[1]:
    raise ValueError(f"n = {max(ns)} exceeds the {rp.shape[1]} samples per prompt.")
  out = {"n": np.asarray(ns), "score_a": [], "score_b": [], "agreement": []}
  for n in ns:
    out["score_a"].append(float(jnp.mean(best_of_n(rp[:, :n], rp[:, :n]))))
    out["score_b"].append(float(jnp.mean(best_of_n(rp[:, :n], re[:, :n]))))
    out["agreement"].append(float(jnp.mean(jnp.argmax(rp[:, :n], 1) == jnp.argmax(re[:, :n], 1))))
  return {k: np.asarray(v) for k, v in out.items()}
