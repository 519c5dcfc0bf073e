"""Safeguards confirmation (`papers/safeguards/safeguard.py`): variance scores by hand, budgets, abstention,
thresholds."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import safeguards as sg
from .helpers import _front_end


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
