"""Tests of the conceptual safeguards implementation (propagation, threshold, confirmation, models, data, run)."""
import itertools
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import sharding
from iclr24_jax.papers import safeguards as sg
from iclr24_jax.papers.safeguards import experiment


def _front_end(k, seed=0, bias=0.3):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.normal(size=k) * 1.5, jnp.float32), "b": jnp.float32(bias)}


def _brute_force(p, params):
  """y_bar by explicit enumeration in float64 (the propagation equation written out)."""
  p = np.asarray(p, np.float64)
  w, b = np.asarray(params["w"], np.float64), float(params["b"])
  out = np.zeros(p.shape[0])
  for c in itertools.product([0, 1], repeat=p.shape[1]):
    c = np.array(c)
    weight = np.prod(np.where(c == 1, p, 1 - p), axis=1)
    out += weight / (1 + np.exp(-(c @ w + b)))
  return out


# --------------------------------------------------------------------------------------------- propagation
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_propagation_equals_enumeration(k):
  rng = np.random.default_rng(k)
  p = rng.random((7, k)).astype(np.float32)
  params = _front_end(k, seed=k)
  y_bar = jax.jit(lambda q: sg.propagate(q, params))(p)
  chex.assert_shape(y_bar, (7,))
  assert y_bar.dtype == jnp.float32
  np.testing.assert_allclose(y_bar, _brute_force(p, params), rtol=1e-5, atol=1e-6)


def test_assignment_table_is_full_rows():
  # The official update_all_cs_probas reshapes the [2^K, K] table to [K 2^K, 1]; ours keeps full K-vectors.
  table = np.asarray(sg.assignments(3))
  chex.assert_shape(table, (8, 3))
  assert {tuple(r) for r in table.astype(int)} == set(itertools.product([0, 1], repeat=3))
  params = _front_end(3)
  np.testing.assert_allclose(sg.logistic_front_end(params, table),
                             1 / (1 + np.exp(-(table @ np.asarray(params["w"]) + 0.3))), rtol=1e-6)


def test_chunked_exact_equals_single_chunk():
  rng = np.random.default_rng(1)
  p = rng.random((5, 10)).astype(np.float32)
  params = _front_end(10)
  one = sg.propagate_exact(p, params, chunk_size=4096)
  many = sg.propagate_exact(p, params, chunk_size=16)   # 64 chunks through lax.scan
  np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(one, _brute_force(p, params), rtol=1e-5, atol=1e-6)


def test_exact_equals_mc_within_standard_error():
  rng = np.random.default_rng(2)
  p = rng.random((64, 6)).astype(np.float32)
  params = _front_end(6, seed=3)
  exact = np.asarray(jax.jit(lambda q: sg.propagate(q, params, method="exact"))(p))
  mc, se = jax.jit(lambda q, key: sg.propagate_mc(q, params, key, num_samples=4000, return_stderr=True))(
      p, jax.random.key(0))
  z = (np.asarray(mc) - exact) / np.asarray(se)
  assert np.all(np.abs(z) < 4.5), np.abs(z).max()        # 64 draws of N(0, 1): |z| < 4.5 w.p. > 0.9995
  assert 0.6 < np.mean(z ** 2) < 1.5                       # chi2_64 / 64: 5%-95% range is ~[0.73, 1.30]
  mc_api = jax.jit(lambda q, key: sg.propagate(q, params, method="mc", key=key, num_samples=4000))(
      p, jax.random.key(0))
  np.testing.assert_allclose(mc_api, mc, rtol=1e-6)


def test_confident_concepts_give_front_end_output():
  rng = np.random.default_rng(3)
  c = (rng.random((16, 5)) < 0.5).astype(np.float32)
  params = _front_end(5)
  f_c = sg.logistic_front_end(params, c)
  np.testing.assert_allclose(sg.propagate(c, params), f_c, rtol=1e-6)
  np.testing.assert_allclose(sg.propagate(c, params, method="mc", key=jax.random.key(1), num_samples=10),
                             f_c, rtol=1e-6)
  # 300 samples = one full chunk of 250 + a masked partial chunk: the mean must still be exactly f(c)
  np.testing.assert_allclose(sg.propagate_mc(c, params, jax.random.key(2), num_samples=300), f_c, rtol=1e-5)


def test_outcomes_are_multilinear_decomposition():
  rng = np.random.default_rng(4)
  p = rng.random((9, 4)).astype(np.float32)
  params = _front_end(4)
  y_bar = np.asarray(sg.propagate(p, params))
  f0, f1 = map(np.asarray, sg.concept_outcomes(p, params))
  chex.assert_shape((f0, f1), (9, 4))
  np.testing.assert_allclose(p * f1 + (1 - p) * f0, np.broadcast_to(y_bar[:, None], p.shape), rtol=1e-5, atol=1e-6)


def test_one_and_eight_devices_agree():
  rng = np.random.default_rng(5)
  p = rng.random((64, 7)).astype(np.float32)
  params = _front_end(7)
  outs = []
  for mesh in sharding.device_meshes((1, 8)):
    fn = jax.jit(lambda q, f: sg.propagate_exact(q, f), in_shardings=(sharding.data_sharding(mesh),
                                                                     sharding.replicated_sharding(mesh)))
    outs.append(np.asarray(fn(jax.device_put(p, sharding.data_sharding(mesh)), params)))
  np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6)


# --------------------------------------------------------------------------------------------- confirmation
def test_variance_scores_hand_checked_k2():
  # f(c) = sigmoid(ln3 c0 - ln3 c1): f(0,0)=0.5, f(1,0)=0.75, f(0,1)=0.25, f(1,1)=0.5; p = (0.5, 0.25).
  params = {"w": jnp.asarray([np.log(3.0), -np.log(3.0)], jnp.float32), "b": jnp.float32(0.0)}
  p = jnp.asarray([[0.5, 0.25]], jnp.float32)
  # k=0: f1 = .25*.5 + .75*.75 = .6875 ; f0 = .25*.25 + .75*.5 = .4375
  #      score = .5*.6875^2 + .5*.4375^2 - (.5*.6875 + .5*.4375)^2 = .33203125 - .31640625 = .015625
  # k=1: f1 = .5*.5 + .5*.25 = .375 ; f0 = .5*.75 + .5*.5 = .625
  #      score = .25*.375^2 + .75*.625^2 - (.25*.375 + .75*.625)^2 = .328125 - .31640625 = .01171875
  f0, f1 = sg.concept_outcomes(p, params)
  np.testing.assert_allclose(f1, [[0.6875, 0.375]], rtol=1e-6)
  np.testing.assert_allclose(f0, [[0.4375, 0.625]], rtol=1e-6)
  np.testing.assert_allclose(sg.propagate(p, params), [0.5625], rtol=1e-6)
  np.testing.assert_allclose(sg.confirmation_scores(p, params), [[0.015625, 0.01171875]], rtol=1e-5)


@pytest.mark.parametrize("strategy", ["variance", "random"])
def test_confirm_respects_budget_and_abstention(strategy):
  rng = np.random.default_rng(6)
  p = rng.random((40, 4)).astype(np.float32)
  abstain = rng.random(40) < 0.4
  budget = np.array([3, 0, 5, 100])
  params = _front_end(4)
  mask = np.asarray(jax.jit(lambda q, a, b, key: sg.confirm(q, params, a, b, strategy, key))(
      p, abstain, budget, jax.random.key(0)))
  chex.assert_shape(mask, (40, 4))
  assert mask.dtype == bool
  assert not mask[~abstain].any()                                     # only abstained instances are confirmed
  np.testing.assert_array_equal(mask.sum(0), np.minimum(budget, abstain.sum()))
  if strategy == "variance":                                          # greedy: confirmed pairs outscore the rest
    scores = np.asarray(sg.confirmation_scores(p, params))
    for k in range(4):
      chosen, rest = scores[mask[:, k], k], scores[abstain & ~mask[:, k], k]
      if chosen.size and rest.size:
        assert chosen.min() >= rest.max()


def test_confirmation_replaces_with_truth():
  p = jnp.asarray([[0.3, 0.6], [0.9, 0.2]], jnp.float32)
  truth = jnp.asarray([[1.0, 0.0], [1.0, 1.0]], jnp.float32)
  mask = jnp.asarray([[True, False], [False, True]])
  np.testing.assert_allclose(sg.apply_confirmation(p, mask, truth), [[1.0, 0.6], [0.9, 1.0]])


# --------------------------------------------------------------------------------------------- threshold
def test_choose_threshold_hand_example():
  # conf = (0.9, 0.8, 0.7, 0.6), correct = (1, 1, 0, 1). t=0.5 -> 3/4, t=0.6 -> 2/3, t=0.7 -> 2/2 >= 0.9.
  # Chosen candidate 0.7; the next larger confidence is 0.8 -> tau = 0.75; coverage 2/4.
  y_bar = jnp.asarray([0.9, 0.2, 0.7, 0.4])
  y = jnp.asarray([1, 0, 0, 0])
  tau = sg.choose_threshold(y_bar, y, 0.9)
  np.testing.assert_allclose(tau, 0.75, rtol=1e-6)
  out = sg.coverage_accuracy(y_bar, y, tau)
  np.testing.assert_allclose(out["coverage"], 0.5)
  np.testing.assert_allclose(out["accuracy"], 1.0)


def test_threshold_meets_target_and_maximises_coverage():
  rng = np.random.default_rng(7)
  y_bar = rng.random(500).astype(np.float32)
  y = (rng.random(500) < y_bar).astype(np.int32)          # calibrated: accuracy rises with confidence
  choose, evaluate = jax.jit(sg.choose_threshold), jax.jit(sg.coverage_accuracy)
  for target in (0.7, 0.85, 0.95):
    tau = float(choose(y_bar, y, target))
    res = evaluate(y_bar, y, tau)
    assert float(res["accuracy"]) >= target
    conf = np.maximum(y_bar, 1 - y_bar)
    correct = (y_bar > 0.5) == (y == 1)
    feasible = [t for t in np.concatenate([[0.5], conf]) if (conf > t).sum() == 0 or correct[conf > t].mean() >= target]
    np.testing.assert_array_equal(conf > tau, conf > min(feasible))     # the same covered set as brute force


# --------------------------------------------------------------------------------------------- models
def test_front_end_matches_sklearn():
  from sklearn.linear_model import LogisticRegression
  rng = np.random.default_rng(8)
  c = (rng.random((2000, 4)) < 0.5).astype(np.float32)
  y = (rng.random(2000) < 1 / (1 + np.exp(-(c @ np.array([1.0, -2.0, 0.5, 3.0]) - 1.0)))).astype(np.int32)
  params = jax.jit(sg.fit_front_end)(c, y)
  ref = LogisticRegression(C=1.0, max_iter=1000, tol=1e-8).fit(c, y)
  np.testing.assert_allclose(params["w"], ref.coef_[0], atol=1e-3)   # scikit-learn's own tol is ~1e-4
  np.testing.assert_allclose(params["b"], ref.intercept_[0], atol=1e-3)


def test_platt_calibration_recovers_scale_and_shift():
  rng = np.random.default_rng(9)
  z = rng.normal(size=(20000, 2)).astype(np.float32)
  targets = (rng.random(z.shape) < 1 / (1 + np.exp(-(np.array([2.0, 0.5]) * z + np.array([1.0, -0.5]))))
             ).astype(np.float32)
  cal = jax.jit(sg.fit_calibration, static_argnames="method")(z, targets, "platt")
  np.testing.assert_allclose(cal["a"], [2.0, 0.5], atol=0.15)     # ~5 standard errors at N = 20,000
  np.testing.assert_allclose(cal["b"], [1.0, -0.5], atol=0.15)
  temp = sg.fit_calibration(z, targets, "temperature")
  np.testing.assert_allclose(temp["b"], [0.0, 0.0])
  probs = sg.calibrated_probs(z, cal)
  assert float(probs.min()) >= 0 and float(probs.max()) <= 1


def test_detector_train_step_lowers_loss():
  from iclr24_jax.common.train_state import TrainState
  import optax
  model = sg.ConceptMLP(num_concepts=3, hidden=16)
  rng = np.random.default_rng(10)
  x = (rng.random((64, 5)) < 0.7).astype(np.float32)
  c = np.stack([x[:, [0, 1, 3]].sum(1) % 2, x[:, [0, 1, 2]].sum(1) % 2, x[:, [0, 1, 4]].sum(1) % 2], 1)
  batch = {"x": jnp.asarray(x), "c": jnp.asarray(c, jnp.float32)}
  params = model.init(jax.random.key(0), batch["x"])["params"]
  chex.assert_shape(model.apply({"params": params}, batch["x"]), (64, 3))
  # the K detectors are independent: K copies of a 1-hidden-layer MLP
  chex.assert_shape(params["detectors"]["Dense_0"]["kernel"], (3, 5, 16))
  state = TrainState.create(params, optax.adam(1e-2), extra={})
  step = chex.assert_max_traces(sg.make_detector_train_step(model), n=1)
  step = jax.jit(step)
  first = None
  for _ in range(30):
    state, metrics = step(state, batch, jax.random.key(1))
    first = float(metrics["loss"]) if first is None else first
  assert float(metrics["loss"]) < first - 0.05


# --------------------------------------------------------------------------------------------- data
def test_synthetic_generator_matches_its_definition():
  ds = sg.make_synthetic(num_samples=20000, seed=0, concept_noise=(0.0, 0.3, 1.0))
  assert (len(ds.train), len(ds.val), len(ds.test)) == (12000, 4000, 4000)
  chex.assert_shape((ds.train.x, ds.train.c), [(12000, 5), (12000, 3)])
  x, c = ds.train.x, ds.train.c
  np.testing.assert_array_equal(c[:, 0], x[:, [0, 1, 3]].sum(1) % 2)          # noise 0: exact parity
  np.testing.assert_allclose(x.mean(), 0.7, atol=0.01)
  np.testing.assert_allclose(ds.train.c_prob[:, 2], 0.5)                      # noise 1: a fair coin
  expected = ds.train.c_prob[:, 1]
  assert abs(c[:, 1].mean() - expected.mean()) < 4 * np.sqrt(0.25 / len(c))
  logit = c @ np.array([1.0, 2.0, 3.0]) - 2.0
  assert abs(ds.train.y.mean() - np.mean(1 / (1 + np.exp(-logit)))) < 4 * np.sqrt(0.25 / len(c))


def test_digit_concepts_on_drawn_images():
  img = np.zeros((2, 8, 8), np.float32)
  img[0, 0:3, 2:5] = 1.0          # a ring in rows 0-2 around pixel (1, 3): a top loop
  img[0, 1, 3] = 0.0
  img[0, 0:8, 6] = 1.0            # a full vertical stroke in column 6
  img[1, 7, 0:5] = 1.0            # a bottom bar, ink low and left
  c = sg.digit_concepts(img)
  names = [n for n, _ in sg.data.DIGITS_CONCEPTS]
  got = [dict(zip(names, row)) for row in c]
  assert got[0]["loop_top"] == 1 and got[0]["loop_bottom"] == 0 and got[0]["stroke_right"] == 1
  assert got[0]["stroke_left"] == 0 and got[0]["bar_top"] == 0
  assert got[1]["bar_bottom"] == 1 and got[1]["ink_low"] == 1 and got[1]["ink_left"] == 1
  assert got[1]["loop_top"] == 0 and got[1]["stroke_right"] == 0
  ds = sg.make_digits_concepts()
  chex.assert_shape(ds.train.c, (len(ds.train), 8))
  assert 0.2 < ds.train.c.mean() < 0.8 and set(np.unique(ds.train.y)) == {0, 1}


# --------------------------------------------------------------------------------------------- errors
def test_clear_errors():
  params = _front_end(3)
  p = np.full((4, 3), 0.5, np.float32)
  with pytest.raises(ValueError, match="probabilities, not logits"):
    sg.propagate(p + 2.0, params)
  with pytest.raises(ValueError, match="NaN"):
    sg.propagate(np.full((4, 3), np.nan, np.float32), params)
  with pytest.raises(ValueError, match="agree"):
    sg.propagate(np.full((4, 2), 0.5, np.float32), params)
  with pytest.raises(ValueError, match=r"\[\.\.\., K\]"):
    sg.propagate(np.float32(0.5), params)
  # per-row math: a single [K] row is one instance (leading batch dims are free, so vmap composes)
  np.testing.assert_allclose(sg.propagate(p[0], params), sg.propagate(p, params)[0], rtol=1e-6)
  with pytest.raises(ValueError, match="PRNG key"):
    sg.propagate(p, params, method="mc")
  with pytest.raises(ValueError, match="unknown propagation method"):
    sg.propagate(p, params, method="sum")
  with pytest.raises(ValueError, match="method='mc'"):
    sg.propagate_exact(np.full((1, 30), 0.5, np.float32), _front_end(30))
  with pytest.raises(ValueError, match="target_accuracy"):
    sg.choose_threshold(jnp.ones(3) * 0.7, jnp.ones(3), 1.5)
  with pytest.raises(ValueError, match="strategy"):
    sg.confirm(p, params, np.ones(4, bool), 1, strategy="oracle")
  with pytest.raises(ValueError, match="PRNG key"):
    sg.confirm(p, params, np.ones(4, bool), 1, strategy="random")
  with pytest.raises(ValueError, match="abstain_mask"):
    sg.confirm(p, params, np.ones(5, bool), 1)
  with pytest.raises(ValueError, match="budget_per_concept"):
    sg.confirm(p, params, np.ones(4, bool), np.array([1, 2]))
  from iclr24_jax.configs import safeguards as cfg_mod
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("cub")


def test_global_budget_hand_example():
  # scores [3 instances, 2 concepts]; instance 2 is not abstained.
  scores = jnp.array([[0.9, 0.1], [0.8, 0.7], [5.0, 5.0]])
  abstain = jnp.array([True, True, False])
  # global, total 3: the three best abstained pairs overall are (0,0) 0.9, (1,0) 0.8, (1,1) 0.7
  np.testing.assert_array_equal(sg.select_top_global(scores, abstain, 3), [[1, 0], [1, 1], [0, 0]])
  # per concept, 1 + 2 = 3 too, but concept 0 may take only one: (0,0); concept 1 takes (1,1) and (0,1)
  np.testing.assert_array_equal(sg.select_top_per_concept(scores, abstain, jnp.array([1, 2])), [[1, 1], [0, 1], [0, 0]])
  # confirm(budget_mode='global') spends sum(budget_per_concept) = 2 in one order: (0,0) 0.9 and (1,0) 0.8
  p = jnp.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], jnp.float32)
  m = sg.select_top_global(scores, abstain, 100)       # more budget than pairs: every abstained pair once
  assert int(m.sum()) == 4 and not bool(m[2].any())
  params = _front_end(2)
  g = sg.confirm(p, params, abstain, 1, budget_mode="global")
  assert int(g.sum()) == 2 and not bool(g[2].any())
  with pytest.raises(ValueError, match="budget_mode"):
    sg.confirm(p, params, abstain, 1, budget_mode="total")
  with pytest.raises(ValueError, match="total_budget"):
    sg.select_top_global(scores, abstain, -1)


# --------------------------------------------------------------------------------------------- smoke run
def test_run_tiny(tmp_path):
  from iclr24_jax.configs import safeguards as cfg_mod
  cfg = cfg_mod.get_config("tiny")
  res = experiment.run(cfg, str(tmp_path), progress=False)
  for name in ("results.json", "metrics.jsonl", "coverage_vs_budget.png"):
    assert os.path.exists(tmp_path / name)
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  curve = saved["curve"]
  assert len(curve["variance"]["coverage"]) == len(cfg.safeguard.budget_fractions)
  # budget 0 = the safeguard without confirmation; a full budget confirms every concept of every abstained
  # instance, so both policies coincide there.
  np.testing.assert_allclose(curve["variance"]["coverage"][0], saved["test_at_tau"]["coverage"], rtol=1e-6)
  np.testing.assert_allclose(curve["variance"]["coverage"][-1], curve["random"]["coverage"][-1], rtol=1e-6)
  assert all(c >= curve["variance"]["coverage"][0] - 1e-6 for c in curve["random"]["coverage"])
  assert 0.5 <= res["tau"] <= 1.0 and "selective_x" in saved
  # the global budget: same total confirmations; at a full budget it confirms everything too
  glob = saved["curve_global"]
  assert glob["budget_mode"] == "global"
  np.testing.assert_allclose(glob["variance"]["coverage"][0], curve["variance"]["coverage"][0], rtol=1e-6)
  np.testing.assert_allclose(glob["variance"]["coverage"][-1], curve["variance"]["coverage"][-1], rtol=1e-6)
