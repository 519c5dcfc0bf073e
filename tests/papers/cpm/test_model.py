"""CPM's model (`papers/cpm/model.py`): the logistic fit against scikit-learn (L1 and L2), pooled
standardisation, reward and preference probability by hand, cross-validation and its folds against
scikit-learn, best-of-n."""
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import checks
from iclr24_jax.papers import cpm
from iclr24_jax.papers.cpm import model as model_lib


_fit_x = jax.jit(model_lib.fit_differences, static_argnames=("penalty", "max_iter", "tol"))


def _problem(n=300, f=8, seed=0):
  rng = np.random.default_rng(seed)
  w_true = rng.normal(size=f) * (rng.random(f) < 0.6)
  fa = rng.normal(size=(n, f)) * 2 + 5
  fb = rng.normal(size=(n, f)) * 2 + 5
  pooled = np.concatenate([fa, fb])
  x = (fa - fb) / (pooled.std(0) + 1e-7)
  y = (rng.random(n) < 1 / (1 + np.exp(-x @ w_true))).astype(np.int32)
  return fa, fb, x.astype(np.float32), y


def _sklearn(x, y, penalty, C, solver):
  from sklearn.linear_model import LogisticRegression
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    m = LogisticRegression(fit_intercept=False, C=C, solver=solver, tol=1e-8, max_iter=100_000,
                           l1_ratio=1.0 if penalty == "l1" else 0.0)
    return m.fit(np.asarray(x, np.float64), y).coef_[0]   # float64: saga converges poorly on float32 input


@pytest.mark.parametrize("penalty,solver", [("l2", "liblinear"), ("l1", "liblinear"), ("l1", "saga")])
def test_fit_matches_sklearn(penalty, solver):
  _, _, x, y = _problem()
  for C in (0.01, 0.1, 1.0, 10.0):
    w, _ = _fit_x(x, y, penalty=penalty, C=C)
    ref = _sklearn(x, y, penalty, C, solver)
    np.testing.assert_allclose(np.asarray(w), ref, atol=1e-3, err_msg=f"{penalty} {solver} C={C}")
    if penalty == "l1":  # the same zero pattern
      np.testing.assert_array_equal(np.abs(np.asarray(w)) > 1e-6, np.abs(ref) > 1e-6)
  w, _ = _fit_x(x, y, penalty="l1", C=0.01)
  assert 0 < int(np.sum(np.abs(np.asarray(w)) > 1e-6)) < x.shape[1]   # the L1 case above is really sparse


def test_fit_minimises_the_sklearn_objective():
  # At the solution the L2 objective's gradient vanishes: w = C sum_i y_i x_i sigmoid(-y_i x_i . w).
  _, _, x, y = _problem(seed=3)
  w, _ = _fit_x(x, y, penalty="l2", C=0.3)
  sign = 2.0 * y - 1.0
  s = 1 / (1 + np.exp(sign * (x @ np.asarray(w, np.float64))))
  np.testing.assert_allclose(np.asarray(w), 0.3 * (x * (sign * s)[:, None]).sum(0), atol=1e-4)
  obj = lambda v: model_lib.logistic_objective(v, x, y, 0.3, "l2")
  assert float(obj(w)) <= float(obj(w + 1e-2)) and float(obj(w)) <= float(obj(w - 1e-2))


def test_standardisation_is_pooled_over_a_and_b():
  fa = jnp.array([[1.0, 10.0], [3.0, 10.0]])
  fb = jnp.array([[5.0, 10.0], [7.0, 10.0]])
  mean, std = cpm.standardization(fa, fb)
  # Pooled values 1, 3, 5, 7: mean 4, population variance (9 + 1 + 1 + 9) / 4 = 5; a constant column: std 0.
  np.testing.assert_allclose(mean, [4.0, 10.0], rtol=1e-6)
  np.testing.assert_allclose(std, [np.sqrt(5.0) + 1e-7, 1e-7], rtol=1e-6)
  x = cpm.pair_differences(fa, fb, mean, std)
  np.testing.assert_allclose(x[:, 0], [-4 / np.sqrt(5.0)] * 2, rtol=1e-5)
  np.testing.assert_allclose(x[:, 1], [0.0, 0.0], atol=1e-6)
  # A per-side standardisation would centre A and B separately and give x = z_A - z_B = [-1, 1] * c: not this.


def test_fit_end_to_end_matches_sklearn_on_pooled_differences():
  fa, fb, x, y = _problem(n=250, f=6, seed=5)
  model = jax.jit(cpm.fit, static_argnames=("penalty",))(fa, fb, y, penalty="l2", C=0.5)
  np.testing.assert_allclose(np.asarray(model.weights), _sklearn(x, y, "l2", 0.5, "liblinear"), atol=1e-3)
  chex.assert_shape(model.weights, (6,))
  assert model.penalty == "l2"
  pooled = np.concatenate([fa, fb])        # the model keeps the pooled moments
  np.testing.assert_allclose(model.mean, pooled.mean(0), rtol=1e-5)
  np.testing.assert_allclose(model.std, pooled.std(0) + 1e-7, rtol=1e-5)


def test_reward_and_preference_prob_by_hand():
  model = cpm.Model(weights=jnp.array([2.0, -1.0]), mean=jnp.array([5.0, 3.0]), std=jnp.array([2.0, 1.0]),
                    C=jnp.array(1.0), penalty="l2")
  f = jnp.array([[7.0, 3.0], [5.0, 5.0]])
  # R = 2 (7 - 5) / 2 - 1 (3 - 3) / 1 = 2;  R = 2 * 0 - 1 * 2 = -2.
  r = cpm.reward(model, f)
  np.testing.assert_allclose(r, [2.0, -2.0], rtol=1e-6)
  p = cpm.preference_prob(model, f, f[::-1])
  np.testing.assert_allclose(p, [1 / (1 + np.exp(-4.0)), 1 / (1 + np.exp(4.0))], rtol=1e-6)
  np.testing.assert_allclose(cpm.accuracy(model, f, f[::-1], jnp.array([1, 0])), 1.0)
  with pytest.raises(checks.ShapeError, match=r"features must be \[\.\.\., F\] with F = 2"):
    cpm.reward(model, jnp.ones((3, 5)))


def test_bad_inputs_raise_clear_errors():
  fa = np.ones((4, 3))
  with pytest.raises(checks.ShapeError, match=r"features_b must be \[N, F\] with F = 3"):
    cpm.fit(fa, np.ones((4, 2)), np.zeros(4), penalty="l2")
  with pytest.raises(ValueError, match=r"labels must be \[N\]"):
    cpm.fit(fa, fa, np.zeros(3), penalty="l2")
  nan = fa.copy()
  nan[1, 2] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    cpm.fit(nan, fa, np.zeros(4), penalty="l2")
  np.testing.assert_array_equal(cpm.complete_pairs(nan, fa), [True, False, True, True])
  with pytest.raises(ValueError, match="penalty"):
    cpm.fit(fa, fa, np.zeros(4), penalty="l3")


def test_single_feature_orientation_is_the_fitted_sign():
  fa, fb, x, y = _problem(n=200, f=4, seed=7)
  corr = cpm.single_feature_correct(fa[:150], fb[:150], y[:150], fa[150:], fb[150:], y[150:])
  for j in range(4):
    w = _sklearn(x[:150, j:j + 1], y[:150], "l2", 1.0, "liblinear")
    pred = np.sign(x[150:, j] * float(w[0]))
    ref = np.where(pred == 0, 0.5, (pred == 2 * y[150:] - 1).astype(float))
    np.testing.assert_array_equal(corr[j], ref)


def test_cross_validate_recovers_known_weights():
  w = np.array(cpm.make_synthetic(0, 2, [1.0] * 14)["weights"])  # shape check of the generator
  assert w.shape == (14,)
  true = np.array([1.2, 0.8, 0.0, 0.6, 0.0, 0.9, 0.0, 0.4, -0.7, -0.5, -0.3, -0.6, 0.0, 0.3])
  d = cpm.make_synthetic(1, 1000, true)
  model, info = cpm.cross_validate(d["fa"], d["fb"], d["labels"], Cs=(0.01, 1.0, 100.0), num_folds=4)
  wh = np.asarray(model.weights)
  cos = wh @ true / np.linalg.norm(wh) / np.linalg.norm(true)
  assert cos > 0.9, cos      # 1000 pairs, 14 weights: the direction is pinned down
  assert set(info["table"]) == {"l1", "l2"} and info["table"]["l1"].shape == (3,)
  # Padding the rows (compile sharing: 1000 -> 1024 rows above, none here) does not change the CV accuracies.
  _, info2 = cpm.cross_validate(d["fa"], d["fb"], d["labels"], penalties=("l1",), Cs=(0.01, 1.0, 100.0),
                                num_folds=4, pad_rows=1000)
  np.testing.assert_allclose(info2["table"]["l1"], info["table"]["l1"], atol=1e-6)


@pytest.mark.parametrize("labels", [
    np.r_[np.zeros(30, int), np.ones(30, int)],                   # sorted, balanced
    np.random.default_rng(0).integers(0, 2, 61),                  # shuffled, unbalanced, N not a multiple of K
    np.random.default_rng(1).choice(["b", "a", "c"], 50, p=[0.5, 0.4, 0.1]),   # classes by first appearance
])
def test_stratified_folds_equal_scikit_learn(labels):
  from sklearn.model_selection import StratifiedKFold
  for seed in (None, 3):
    skf = StratifiedKFold(8, shuffle=seed is not None, random_state=seed)
    ref = np.empty(len(labels), int)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")   # "the least populated class has only 6 members": the 3-class case
      for k, (_, test) in enumerate(skf.split(np.zeros((len(labels), 1)), labels)):
        ref[test] = k
    np.testing.assert_array_equal(model_lib.stratified_fold_ids(labels, 8, seed), ref, err_msg=f"seed={seed}")
  with pytest.raises(ValueError, match="num_folds"):
    model_lib.stratified_fold_ids(np.r_[0, 0, 1, 1], 3)        # every class smaller than K


@pytest.fixture(scope="module")
def correlated_pairs():
  """The small correlated regime of the HH reproduction: 60 pairs, 14 features correlated at 0.9."""
  true = np.array([1.2, 0.8, 0.0, 0.6, 0.0, 0.9, 0.0, 0.4, -0.7, -0.5, -0.3, -0.6, 0.0, 0.3])
  d = cpm.make_synthetic(4, 60, true, feature_corr=0.9)
  pooled = np.concatenate([d["fa"], d["fb"]])
  x = (d["fa"] - pooled.mean(0)) / (pooled.std(0) + 1e-7) - (d["fb"] - pooled.mean(0)) / (pooled.std(0) + 1e-7)
  return d, x, d["labels"], cpm.cross_validate(d["fa"], d["fb"], d["labels"])


def test_cv_table_equals_scikit_learn_per_fold(correlated_pairs):
  # The official search: GridSearchCV over penalty x C (official grid, C up to 1e5), cv=8 = StratifiedKFold(8),
  # scoring='accuracy', refit on all rows; liblinear solved to tol 1e-10 is the reference optimum.
  from sklearn.linear_model import LogisticRegression
  from sklearn.model_selection import GridSearchCV, StratifiedKFold
  d, x, y, (model, info) = correlated_pairs
  grid = {"penalty": ["l1", "l2"], "C": list(cpm.OFFICIAL_CS)}
  est = LogisticRegression(fit_intercept=False, solver="liblinear", tol=1e-10, max_iter=100_000)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    gs = GridSearchCV(est, grid, cv=StratifiedKFold(8), scoring="accuracy").fit(x, y)
  res = gs.cv_results_
  for p in ("l1", "l2"):
    for j, c in enumerate(cpm.OFFICIAL_CS):
      i = next(i for i, q in enumerate(res["params"]) if q == {"C": c, "penalty": p})
      folds = [res[f"split{k}_test_score"][i] for k in range(8)]
      np.testing.assert_array_equal(info["fold_accuracy"][p][j], folds, err_msg=f"{p} C={c:.3g}")
      assert info["table"][p][j] == res["mean_test_score"][i]
  assert (info["penalty"], info["C"]) == (gs.best_params_["penalty"], gs.best_params_["C"])
  assert info["cv_accuracy"] == gs.best_score_
  np.testing.assert_allclose(np.asarray(model.weights), gs.best_estimator_.coef_[0], atol=1e-4)
  # The regime is the hard one: the table varies with C, and the weakest penalties give large weights.
  assert len({round(a, 6) for a in info["table"]["l2"]}) > 3
  assert np.abs(LogisticRegression(fit_intercept=False, C=1e5, solver="liblinear", tol=1e-10, max_iter=100_000)
                .fit(x, y).coef_).max() > 1.0


def test_cv_fits_stop_in_a_few_newton_steps(correlated_pairs):
  # No fit of the vmapped batch runs to the cap of 100 (a float32 tolerance it cannot reach would make all wait):
  # measured here, L2 takes 1-6 steps along the warm-started path, L1 1-25 (its support grows from 0 to 14
  # features between C = 0.04 and 1e5).
  _, _, _, (_, info) = correlated_pairs
  for p, steps in info["newton_steps"].items():
    assert steps.shape == (len(cpm.OFFICIAL_CS), 9)
    assert 1 <= steps.min() and steps.max() <= (8 if p == "l2" else 40), (p, steps)


def test_more_features_than_rows_matches_sklearn():
  # The standard PM's case (1152 dims, ~50 rows): L2 Newton on the rows (Woodbury), against liblinear.
  rng = np.random.default_rng(2)
  x = rng.normal(size=(40, 96)).astype(np.float32)
  y = (rng.random(40) < 1 / (1 + np.exp(-x[:, :4].sum(1)))).astype(np.int32)
  for C in (0.01, 1.0):
    w, steps = _fit_x(x, y, penalty="l2", C=C)
    np.testing.assert_allclose(np.asarray(w), _sklearn(x, y, "l2", C, "liblinear"), atol=1e-4, err_msg=f"C={C}")
    assert int(steps) < 20


def test_best_of_n_by_hand():
  pick = jnp.array([[0.1, 0.9, 0.5], [2.0, 1.0, 3.0]])
  ev = jnp.array([[10.0, 20.0, 30.0], [1.0, 2.0, 3.0]])
  np.testing.assert_allclose(cpm.best_of_n(pick, ev), [20.0, 3.0])
  curve = cpm.best_of_n_curve(pick, ev, ns=(1, 2, 3))
  np.testing.assert_allclose(curve["score_b"], [(10 + 1) / 2, (20 + 1) / 2, (20 + 3) / 2])
  np.testing.assert_allclose(curve["agreement"], [1.0, 0.5, 0.5])   # n=1 always agrees
  # Picking by the evaluator itself is the best any picker can do.
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
  assert float(cpm.best_of_n(b, b).mean()) >= float(cpm.best_of_n(a, b).mean())
  with pytest.raises(ValueError, match=r"\[P, n\]"):
    cpm.best_of_n(pick, ev[:, :2])
