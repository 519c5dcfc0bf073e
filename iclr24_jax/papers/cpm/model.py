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

All functions are pure JAX (jit / vmap over C, folds or seeds); `fit` solves L2 by Newton's method and L1 by
proximal Newton (coordinate descent on the quadratic model), both with Armijo backtracking; `cross_validate`
runs the whole official grid search as one compiled program.
"""
from __future__ import annotations

import functools
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.common import compile_cache

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


# ------------------------------------------------------------------------------------------- the solver
#
# Both penalties are solved by Newton's method on the objective divided by C n (the same minimiser; values are
# O(1), so one relative tolerance serves every C):
#   F(w) = (1/n) sum_i s_i softplus(-y_i x_i . w) + r(w),   s_i row weights (0/1 fold masks), n = sum_i s_i,
#   r(w) = ||w||^2 / (2 C n)  (L2)   or   ||w||_1 / (C n)  (L1).
# L2: Newton steps, (H + I / (C n)) d = -grad (liblinear's L2 solver is a trust-region Newton method).
# L1: orthant-wise Newton steps (the OWL-QN scheme of Andrew & Gao 2007 with the exact Hessian; Byrd et al. 2016):
# on the orthant that w and the minimum-norm subgradient pg point into, F is smooth, so d = -H_FF^-1 pg_F on
# the free coordinates (nonzero, or zero with |grad| > 1 / (C n)); trial points are projected back onto that
# orthant, which zeroes the coordinates a step would carry across 0.
# Both share one code path (a masked Cholesky solve) and an Armijo backtracking line search; with 14 features a
# Newton step costs little more than a gradient step and a fit takes 2-10 of them (fewer warm-started), where
# L-BFGS / FISTA needed hundreds at large C. A fit stops when the predicted decrease of F falls to float
# resolution (tol x |F|), after taking that last step; a threshold below what float32 resolves would run every
# fit of a vmapped batch to max_iter.

_ARMIJO = 1e-4          # sufficient-decrease constant of the backtracking line search
_MAX_HALVINGS = 30
_EPS = float(np.finfo(np.float32).eps)
_OUTER_MAX_FEATURES = 32   # above this the [N, F * F] row outer products cost more memory than they save


def _margin_terms(z, sign):
  # Per-row loss softplus(-y z) and sigmoid(-y z) (= 1 - P(correct)) from the margins z = x . w; one exp
  # serves both (fewer transcendental kernels to compile).
  m = -sign * z
  e = jnp.exp(-jnp.abs(m))
  return jnp.maximum(m, 0.0) + jnp.log1p(e), jnp.where(m >= 0, 1.0, e) / (1.0 + e)


def _row_outer(x):
  # [N, F * F] outer products of the rows: a Hessian is then one [N] x [N, F * F] product (a batch of fits one
  # matrix product), the fast form for few features.
  return (x[:, :, None] * x[:, None, :]).reshape(x.shape[0], -1) if x.shape[1] <= _OUTER_MAX_FEATURES else None


def _spd_solve(h, b):
  # h^-1 b for a symmetric positive (semi)definite h. Up to 32 x 32 by Gauss-Jordan elimination in one small
  # loop (no pivoting is needed for a positive definite matrix): at F = 14 a LAPACK call costs more to lower
  # and compile than it saves. Larger systems (the standard PM) go to LAPACK's LU solve (its batched Cholesky
  # measured 25x slower here: 0.35 s vs 0.013 s for 9 systems of 256). A ridge of 1e-7 x the mean diagonal
  # (about float32's resolution of h's entries) keeps h definite when features are collinear and 1 / (C n)
  # ~ 1e-9 is all that holds it away from singular; it leaves the solution (zero gradient) alone.
  f = h.shape[0]
  h = h + (1e-7 * jnp.trace(h) / f + 1e-30) * jnp.eye(f, dtype=h.dtype)
  if f > _OUTER_MAX_FEATURES:
    return jnp.linalg.solve(h, b)

  def eliminate(k, a):
    row = a[k] / a[k, k]
    return (a - a[:, k, None] * row[None, :]).at[k].set(row)

  return jax.lax.fori_loop(0, f, eliminate, jnp.concatenate([h, b[:, None]], axis=1))[:, f]


def _solve(x, outer, sign, sample_weight, C, w0, l1, tol, max_iter: int):
  """One fit (see the section comment); returns (w [F], Newton steps []).

  `l1` is a bool, Python or traced: a vmapped batch of L1 and L2 fits runs one compiled solver. Each pass of
  the loop is a line search along the last direction, then a new direction at the accepted point; the
  objective's exp / log1p are evaluated in the line search only (the new direction reuses the accepted point's
  sigmoid), which keeps the compiled program small. The first pass searches along d = 0: it evaluates w0.
  """
  n, f = x.shape
  n_eff = jnp.maximum(jnp.sum(sample_weight), 1.0)
  rows = sample_weight / n_eff
  lam = 1.0 / (C * n_eff)
  # Features outnumbering rows (the standard PM on 1152-dim embeddings, L2 only): Newton on the rows instead.
  dual = f > max(n, _OUTER_MAX_FEATURES) and isinstance(l1, bool) and not l1

  def evaluate(w):
    loss, prob = _margin_terms(x @ w, sign)
    return jnp.sum(rows * loss) + lam * jnp.where(l1, jnp.sum(jnp.abs(w)), 0.5 * jnp.sum(w * w)), prob

  def direction(w, prob):
    grad = x.T @ (rows * -sign * prob)                       # gradient of the mean loss
    curv = rows * prob * (1.0 - prob)
    # L1: the minimum-norm subgradient, the orthant it points into and the free coordinates.
    pg = jnp.where(w != 0, grad + lam * jnp.sign(w),
                   jnp.where(grad + lam < 0, grad + lam, jnp.where(grad - lam > 0, grad - lam, 0.0)))
    orthant = jnp.where(w != 0, jnp.sign(w), -jnp.sign(pg))
    free = jnp.where(l1, orthant != 0, True)
    rhs = jnp.where(l1, pg, grad + lam * w)
    if dual:   # (X^T D X + lam I)^-1 g = (g - A^T (lam I + A A^T)^-1 A g) / lam,  A = sqrt(D) X
      a = x * jnp.sqrt(curv)[:, None]
      d = -(rhs - a.T @ _spd_solve(a @ a.T + lam * jnp.eye(n, dtype=x.dtype), a @ rhs)) / lam
    else:
      hess = (curv @ outer).reshape(f, f) if outer is not None else (x * curv[:, None]).T @ x
      h = jnp.where(free[:, None] & free[None, :], hess, 0.0) + jnp.diag(jnp.where(l1, jnp.where(free, 0.0, 1.0),
                                                                                   lam))
      d = -_spd_solve(h, rhs)
    return d, rhs, orthant

  def body(carry):
    w, value, d, rhs, orthant, k, _ = carry
    decrease = rhs @ d                                        # predicted decrease along d (< 0)
    converged = (k > 0) & (-decrease <= tol * jnp.abs(value))

    def trial(t):
      w_t = w + t * d
      return jnp.where(l1 & (jnp.sign(w_t) != orthant), 0.0, w_t)   # L1: stay on the orthant

    def armijo(t, v):
      return v <= value + _ARMIJO * rhs @ (trial(t) - w)

    def searching(ls):
      t, v, _, h = ls
      return (h == 0) | (~armijo(t, v) & ~converged & (h <= _MAX_HALVINGS))

    def halve(ls):
      t, _, _, h = ls
      t = jnp.where(h == 0, 1.0, 0.5 * t)
      return (t,) + evaluate(trial(t)) + (h + 1,)

    t, v, prob, _ = jax.lax.while_loop(searching, halve, (jnp.ones((), x.dtype), value, jnp.zeros_like(sign),
                                                         jnp.int32(0)))
    # A step is taken if it passes Armijo or, once converged, leaves the objective within float noise; a line
    # search that finds nothing (float resolution reached) ends the fit where it is.
    ok = armijo(t, v) | (converged & (v <= value + 4 * _EPS * jnp.abs(value)))
    w_new = jnp.where(ok, trial(t), w)
    tiny = (k > 0) & (jnp.max(jnp.abs(w_new - w)) <= _EPS * jnp.max(jnp.abs(w_new)))
    d_new, rhs_new, orthant_new = direction(w_new, prob)
    return w_new, jnp.where(ok, v, value), d_new, rhs_new, orthant_new, k + 1, converged | ~ok | tiny

  def unfinished(carry):
    k, done = carry[-2:]
    return (k <= max_iter) & ~done

  zero = jnp.zeros_like(w0)
  init = (w0, jnp.asarray(jnp.inf, x.dtype), zero, zero, zero, jnp.int32(0), jnp.asarray(False))
  w, _, _, _, _, k, _ = jax.lax.while_loop(unfinished, body, init)
  return w, k - 1


DEFAULT_TOL = 1e-7      # relative predicted decrease at which a fit stops (float32 resolves ~1.2e-7)
DEFAULT_MAX_ITER = 100


def fit_differences(x: jax.Array, labels: jax.Array, penalty: str = "l2", C: float | jax.Array = 1.0,
                    sample_weight: jax.Array | None = None, max_iter: int | None = None,
                    tol: float | None = None, init: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Minimises `logistic_objective` over w for given pair differences (no intercept).

  Args:
    x: [N, F] standardised pair differences.
    labels: [N] in {0, 1} (1: the first reply is preferred).
    penalty: 'l2' (Newton) or 'l1' (proximal Newton, coordinate descent inside).
    C: inverse regularisation strength (scikit-learn's C: it multiplies the summed log-loss).
    sample_weight: [N] optional row weights (0/1 masks select cross-validation folds).
    max_iter: cap on (proximal) Newton steps (default 100; fits take 2-10).
    tol: stop when the predicted decrease of the objective is below tol x its value (default 1e-7, float32
      resolution; the step that gets there is still taken).
    init: [F] starting point (default zeros; a warm start from a nearby C shortens a regularisation path).

  Returns:
    (weights [F], Newton steps taken []); NaN weights under jit for labels outside {0, 1}, C <= 0 or
    non-finite x (eager calls raise).
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
  return checks.poison(_solve(x, _row_outer(x), sign, sw, C, w0, penalty == "l1",
                              jnp.float32(DEFAULT_TOL if tol is None else tol), max_iter or DEFAULT_MAX_ITER), ok)


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

  The official evaluation counts a tie as wrong (see the comment in the code); `cross_validate` scores its folds
  as scikit-learn does (a zero margin predicts B).

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
  # Deviation: official `get_model_statistics` takes mean(chosen > rejected), a tie counting 0; a tie needs equal
  # rewards (all weights 0, or identical features), and a model that cannot tell the replies apart is at
  # chance, so it counts 1/2 here.
  out = jnp.where(margin == 0, 0.5, (sign * margin > 0).astype(jnp.float32))
  return checks.poison(jnp.where(jnp.isnan(margin), jnp.nan, out), ok)


# XLA:CPU compiles this program about twice as fast with its older elemental fusion emitter and LLVM's -O1,
# and runs it as fast (measured: 0.74 vs 1.59 s compile CPU, run 0.023 s both at N = 1,024); a user's first
# call is mostly compilation. The options are ignored off the CPU backend.
_COMPILE_FAST = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}


def stratified_fold_ids(labels, num_folds: int, seed: int | None = None) -> np.ndarray:
  """The test fold of every row under scikit-learn's `StratifiedKFold(num_folds)`: what the official
  `GridSearchCV(..., cv=8)` uses for a classifier (unshuffled).

  The rows of each class (classes ordered by first appearance) are dealt to the folds in row order, fold i
  taking as many as fold i of the class-sorted labels read with stride K holds, so every fold has about the
  same class balance and the first rows of each class go to fold 0.

  Args:
    labels: [N] class labels.
    num_folds: K >= 2.
    seed: None (official: no shuffling), or an int: each class's fold list is shuffled with
      `np.random.RandomState(seed)`, as `StratifiedKFold(K, shuffle=True, random_state=seed)` does.

  Returns:
    [N] int32 test fold index of each row.

  Raises:
    ValueError: K < 2, K > N, or every class smaller than K (scikit-learn's conditions).
  """
  y = np.asarray(labels).reshape(-1)
  n = y.shape[0]
  if num_folds < 2 or num_folds > n:
    raise ValueError(f"num_folds must be in [2, N = {n}], got {num_folds}.")
  _, first, inverse = np.unique(y, return_index=True, return_inverse=True)
  rank = np.empty(len(first), np.int64)
  rank[np.argsort(first, kind="stable")] = np.arange(len(first))
  code = rank[inverse.reshape(-1)]                           # classes numbered by first appearance
  counts = np.bincount(code)
  if np.all(counts < num_folds):
    raise ValueError(f"num_folds={num_folds} exceeds the size of every class ({counts.tolist()}); lower it.")
  by_class = np.sort(code)
  per_fold = np.stack([np.bincount(by_class[i::num_folds], minlength=len(counts)) for i in range(num_folds)])
  rng = None if seed is None else np.random.RandomState(seed)
  out = np.empty(n, np.int32)
  for c in range(len(counts)):
    folds = np.repeat(np.arange(num_folds, dtype=np.int32), per_fold[:, c])
    if rng is not None:
      rng.shuffle(folds)
    out[code == c] = folds
  return out


@functools.partial(jax.jit, static_argnames=("penalties", "num_folds", "max_iter"), compiler_options=_COMPILE_FAST)
def _cv_program(x, labels, test_fold, Cs, tol, penalties: tuple, num_folds: int, max_iter: int):
  # Every (penalty, C, fold) fit and every refit on all rows, in one program. Members = (fold, refit) are
  # vmapped; the C grid (ascending) is a scan whose fits start from the previous C's solutions (a warm-started
  # regularisation path). Padded rows have test_fold = -1: in no training or test set.
  sign = 2.0 * labels.astype(x.dtype) - 1.0
  outer = _row_outer(x)
  members = jnp.arange(num_folds + 1)                       # member num_folds: the refit, nothing held out
  valid = test_fold >= 0
  train = ((test_fold[None, :] != members[:, None]) & valid[None, :]).astype(x.dtype)    # [K+1, R]
  test = test_fold[None, :] == members[:, None]
  predicted = labels[None, :] == 1

  num_members = num_folds + 1
  is_l1 = jnp.repeat(jnp.asarray([p == "l1" for p in penalties]), num_members)      # [P (K+1)]
  masks = jnp.tile(train, (len(penalties), 1))                                         # [P (K+1), R]
  one = penalties[0] == "l1" if len(set(penalties)) == 1 else None   # one penalty: a static flag (L2 may go dual)

  def step(w_prev, C):
    solve = jax.vmap(lambda sw, w0, flag: _solve(x, outer, sign, sw, C, w0, flag if one is None else one, tol,
                                                 max_iter))
    w, steps = solve(masks, w_prev.reshape(-1, x.shape[1]), is_l1)
    w = w.reshape(len(penalties), num_members, -1)           # [P, K+1, F]
    # scikit-learn's accuracy: predict() says class 1 iff the decision x . w > 0 (a zero margin is class 0).
    correct = ((w @ x.T) > 0) == predicted[None]              # [P, K+1, R]
    hits = jnp.sum(correct & test[None], axis=-1)             # [P, K+1]
    return w, (hits[:, :num_folds], w[:, num_folds], steps.reshape(len(penalties), num_members))

  w_init = jnp.zeros((len(penalties), num_folds + 1, x.shape[1]), x.dtype)
  _, out = jax.lax.scan(step, w_init, Cs)
  return out                                   # hits [C, P, K], refits [C, P, F], steps [C, P, K+1]


def _pad_rows(n: int, multiple: int) -> int:
  return int(multiple * max(1, -(-n // multiple)))


def cross_validate(features_a: jax.Array, features_b: jax.Array, labels: jax.Array,
                   penalties: Sequence[str] = PENALTIES, Cs: Sequence[float] = OFFICIAL_CS, num_folds: int = 8,
                   seed: int | None = None, pad_rows: int = 64, tol: float | None = None,
                   max_iter: int | None = None) -> tuple[Model, dict]:
  """Chooses (penalty, C) by k-fold cross-validated accuracy and refits on all pairs: the official grid search
  (`GridSearchCV(LogisticRegression(fit_intercept=False), {penalty: [l1, l2], C: logspace(-5, 5, 12)}, cv=8,
  scoring='accuracy')` on the pooled-standardised differences, `train_model_g`).

  Standardisation uses all the given pairs before the folds are split (official; computed in float64 as the
  official pandas input is, then cast to float32). Folds are scikit-learn's `StratifiedKFold(num_folds)`
  (`stratified_fold_ids`). A fold's accuracy counts a pair as predicting A iff its margin is > 0 (scikit-learn's
  `predict`), and the best setting is the first maximum of the mean fold accuracy in GridSearchCV's candidate
  order (C in grid order, then penalty). Every (penalty, C, fold) fit and every refit runs in one compiled
  program (a warm-started C path per penalty, folds vmapped); rows are padded with zero weight to a multiple of
  `pad_rows`, so data sets of similar size share it.

  The official grid also lists the solvers liblinear and saga; both minimise the same objective, solved here to
  float32 resolution, so one fit stands for both (see the deviation noted in the code).

  Args:
    features_a, features_b: [N, F] (no NaN).
    labels: [N] in {0, 1}.
    penalties: penalties searched ('l1', 'l2').
    Cs: C grid.
    num_folds: folds K.
    seed: None for the official unshuffled folds, or the shuffle seed (see `stratified_fold_ids`).
    pad_rows: row padding multiple (compile sharing); the result does not depend on it.
    tol, max_iter: solver settings (see `fit_differences`).

  Returns:
    (model refitted with the best setting, info): info = {'penalty', 'C', 'cv_accuracy' (its mean fold
    accuracy), 'table': {penalty: [len(Cs)] mean fold accuracy}, 'fold_accuracy': {penalty: [len(Cs), K]},
    'newton_steps': {penalty: [len(Cs), K + 1] steps of each fit, the refit last}}.
  """
  where = "cpm.cross_validate"
  _check_pairs(features_a, features_b, labels, where=where)
  for pen in penalties:
    checks.choice(where, "penalties", pen, PENALTIES, "penalty")
  for c in Cs:
    _check_C(where, float(c))
  checks.static_int(where, "num_folds", num_folds, low=2, high=np.shape(features_a)[0])
  labels = checks.host_array(where, "labels", labels)
  features_a = checks.host_array(where, "features_a", features_a)
  features_b = checks.host_array(where, "features_b", features_b)
  _pair_values(where, features_a, features_b, labels)
  fa64, fb64 = np.asarray(features_a, np.float64), np.asarray(features_b, np.float64)
  pooled = np.concatenate([fa64, fb64])
  mean, std = pooled.mean(0), pooled.std(0) + STD_EPS
  x = (fa64 - mean) / std - (fb64 - mean) / std
  y = np.asarray(labels).astype(np.int32)
  n, f = x.shape
  rows = _pad_rows(n, pad_rows)
  xp = np.zeros((rows, f), np.float32)
  xp[:n] = x
  yp = np.zeros(rows, np.int32)
  yp[:n] = y
  folds = np.full(rows, -1, np.int32)
  folds[:n] = stratified_fold_ids(y, num_folds, seed)
  grid = np.asarray(list(Cs), np.float64)
  # Deviation: the official grid crosses penalty x C with the solvers liblinear and saga, which minimise the same
  # objective; one fit to float32 resolution stands for both (saga's default 100 epochs can stop short of the
  # optimum at large C and score differently; in a tie GridSearchCV keeps liblinear, listed first).
  order = np.argsort(grid, kind="stable")                   # the path runs from strong to weak penalties
  hits, refits, steps = compile_cache.cached_call(
      _cv_program, xp, yp, folds, grid[order].astype(np.float32), np.float32(DEFAULT_TOL if tol is None else tol),
      penalties=tuple(penalties), num_folds=num_folds, max_iter=max_iter or DEFAULT_MAX_ITER)
  inv = np.argsort(order)
  hits, refits, steps = np.asarray(hits)[inv], np.asarray(refits)[inv], np.asarray(steps)[inv]
  fold_sizes = np.bincount(folds[:n], minlength=num_folds)
  acc = hits / fold_sizes                                   # [C, P, K] float64, as accuracy_score gives it
  mean_acc = acc.mean(-1)                                   # [C, P]
  j, p = np.unravel_index(int(np.argmax(mean_acc)), mean_acc.shape)   # first maximum: C-major, then penalty
  pen = penalties[p]
  model = Model(weights=jnp.asarray(refits[j, p]), mean=jnp.asarray(mean.astype(np.float32)),
                std=jnp.asarray(std.astype(np.float32)), C=jnp.asarray(np.float32(grid[j])), penalty=pen)
  info = {"penalty": pen, "C": float(grid[j]), "cv_accuracy": float(mean_acc[j, p]),
          "table": {q: mean_acc[:, i] for i, q in enumerate(penalties)},
          "fold_accuracy": {q: acc[:, i] for i, q in enumerate(penalties)},
          "newton_steps": {q: steps[:, i] for i, q in enumerate(penalties)}}
  return model, info


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
