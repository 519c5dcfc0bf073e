"""CPM (Go et al., ICLR 2024): the logistic fit against scikit-learn (L1 and L2), pooled standardisation, reward
and preference probability by hand, the score parser and prompts, the expected-score reader against the plain
forward pass, best-of-n, the cache, the HH-RLHF pairs, and a smoke run of the tiny experiment."""
import json
import os
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import checks
from iclr24_jax.papers import cpm
from iclr24_jax.papers.cpm import model as model_lib
from iclr24_jax.papers.cpm import scoring

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


# --------------------------------------------------------------------------------------------- the fit


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


# --------------------------------------------------------------------------------- features and prompts


def test_parse_score():
  assert cpm.parse_score("7") == 7
  assert cpm.parse_score(" 10/10, very helpful") == 10
  assert cpm.parse_score("8.") == 8
  assert cpm.parse_score("The reply is good") is None     # official regex ^\d+ fails -> missing
  assert cpm.parse_score("") is None and cpm.parse_score(None) is None
  assert cpm.parse_score("0") is None and cpm.parse_score("85") is None   # outside 1..10 -> missing


def test_feature_prompts():
  assert len(cpm.FEATURES) == 13 and cpm.ALL_FEATURES[-1] == "length"
  p = cpm.feature_prompt("factuality", "Human: What is 2+2?", "It is 4.")
  assert "is factually correct" in p and "egregiously incorrect" in p and "fully correct" in p
  assert p.index("It is 4.") < p.index("is factually correct")   # the question comes after the reply
  assert p.endswith("Answer:")
  prefixes = {cpm.prompt_parts(f, "Human: hi", "Hello!")[0] for f in cpm.FEATURES}
  assert len(prefixes) == 1                                       # one shared prefix for all 13 questions
  a, b = cpm.chat_parts("intent", "Human: hi", "Hello!", template="short")
  assert a.startswith("<|im_start|>user\n") and b.endswith("<|im_start|>assistant\n")
  with pytest.raises(ValueError, match="unknown feature"):
    cpm.feature_prompt("length", "h", "r")
  np.testing.assert_allclose(cpm.length_feature(["a" * 250, ""]), [2.5, 0.0])


def test_expected_score():
  np.testing.assert_allclose(cpm.expected_score(np.zeros(10)), 5.5)
  peaked = np.full(10, -np.inf)
  peaked[6] = 0.0
  np.testing.assert_allclose(cpm.expected_score(peaked), 7.0)
  # p(3) = p(8) = 1/2 -> 5.5; normalisation does not matter.
  lp = np.full((2, 10), -50.0)
  lp[:, 2] = lp[:, 7] = -3.0
  np.testing.assert_allclose(cpm.expected_score(lp), [5.5, 5.5], atol=1e-9)
  with pytest.raises(ValueError, match="10"):
    cpm.expected_score(np.zeros(9))


def test_split_dialogue_and_messages():
  text = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant: fine, thanks"
  h, r = cpm.split_dialogue(text)
  assert r == "fine, thanks" and h.endswith("how are you?")
  msgs = cpm.history_messages(h)
  assert [m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[1]["content"] == "hello"


# ------------------------------------------------------------------------------------------ best of n


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


# ------------------------------------------------------------------------------ scoring with an LM


def test_suffix_digit_logprobs_equal_the_plain_forward_pass():
  from iclr24_jax import lm
  config = lm.tiny_config(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                          intermediate_size=64)
  params = lm.init_params(jax.random.key(0), config)
  rng = np.random.default_rng(0)
  digits = np.arange(10, 20, dtype=np.int32)            # token ids of "0".."9" in this toy vocabulary
  prefixes = [list(rng.integers(20, 64, 9)), list(rng.integers(20, 64, 6))]
  suffixes = [[list(rng.integers(20, 64, k)) for k in (3, 5, 2)] for _ in prefixes]
  tp, ts = 12, 8
  pids = np.zeros((2, tp), np.int32)
  pmask = np.zeros((2, tp), bool)
  sids = np.zeros((2, 3, ts), np.int32)
  smask = np.zeros((2, 3, ts), bool)
  for b, p in enumerate(prefixes):
    pids[b, tp - len(p):], pmask[b, tp - len(p):] = p, True      # left padding
    for s, q in enumerate(suffixes[b]):
      row = q + [int(digits[1])]                                 # the question, then "1"
      sids[b, s, :len(row)], smask[b, s, :len(row)] = row, True
  lp, h_last, h_mean = jax.jit(lambda *a: scoring.suffix_digit_logprobs(params, config, *a))(
      pids, pmask, sids, smask, digits)
  chex.assert_shape(lp, (2, 3, 10))
  # The reference: a plain forward pass over prefix + question + "1", right-padded to one length (causal, so
  # the padding does not reach the positions read), one compiled program.
  ref_fn = jax.jit(lambda ids: jax.nn.log_softmax(lm.forward(params, config, ids), axis=-1))
  for b, p in enumerate(prefixes):
    for s, q in enumerate(suffixes[b]):
      seq = p + q + [int(digits[1])]
      ids = np.zeros((1, 20), np.int32)
      ids[0, :len(seq)] = seq
      logp = ref_fn(ids)[0]
      first, after1 = logp[len(p) + len(q) - 1], logp[len(p) + len(q)]
      for k in range(2, 10):                                     # "2".."9": one token
        np.testing.assert_allclose(lp[b, s, k - 1], first[digits[k]], atol=1e-4)
      np.testing.assert_allclose(lp[b, s, 9], first[digits[1]] + after1[digits[0]], atol=1e-4)   # "10"
      p_digit = float(np.exp(jax.nn.logsumexp(after1[digits])))
      np.testing.assert_allclose(lp[b, s, 0], first[digits[1]] + np.log1p(-p_digit), atol=1e-4)   # "1" alone
  hid = jax.jit(lambda i, m: lm.hidden_states(params, config, i, m))(pids, pmask)   # left padding is ignored
  for b, p in enumerate(prefixes):
    np.testing.assert_allclose(h_last[b], hid[b, -1], atol=1e-4)
    np.testing.assert_allclose(h_mean[b], hid[b, tp - len(p):].mean(0), atol=1e-4)


def test_score_cache_is_resumable(tmp_path):
  path = tmp_path / "scores.jsonl"
  cache = scoring.ScoreCache(path)
  scorer = scoring.FakeScorer()
  out1 = scoring.score_features(scorer, ["Human: hi"] * 2, ["Hello!", "Go away."], cache=cache)
  with open(path, "a") as f:
    f.write('{"key": "torn')                 # an interrupted write
  cache2 = scoring.ScoreCache(path)
  assert len(cache2) == 2 and cache2.skipped_lines == 1

  class Boom(scoring.FakeScorer):
    def score(self, *a, **k):
      raise AssertionError("a cached reply was scored again")
  out2 = scoring.score_features(Boom(), ["Human: hi"] * 2, ["Hello!", "Go away."], cache=cache2)
  np.testing.assert_allclose(out1["scores"], out2["scores"], atol=1e-4)
  chex.assert_shape(out2["scores"], (2, 13))
  assert scoring.ScoreCache.key("m", "p") != scoring.ScoreCache.key("m2", "p")   # keyed by model and prompt
  parsed = scoring.score_features(scorer, ["Human: hi"] * 3, ["a", "b", "c"], mode="parse")
  assert parsed["scores"].shape == (3, 13) and parsed["embedding"] is None


@pytest.mark.slow
def test_smollm2_scorer_matches_choice_logprobs():
  from iclr24_jax import lm
  scorer = scoring.SmolLMScorer(batch_size=2)
  h, r = "Human: How do I make tea?", "Boil water, add a tea bag, wait three minutes."
  out = scorer.score([h], [r])
  for j in (0, 6):
    a, b = cpm.chat_parts(cpm.FEATURES[j], h, r, scorer.tokenizer, template=scorer.template)
    ref = lm.scoring.choice_logprobs(scorer.params, scorer.config, scorer.tokenizer, [a + b],
                                     [str(k) for k in range(1, 11)])[0]
    np.testing.assert_allclose(out["option_logprobs"][0, j, 1:], ref[1:], atol=2e-3)   # "2".."10"
    assert out["option_logprobs"][0, j, 0] <= ref[0] + 1e-4        # "1" alone <= "1" as a first token
  s = cpm.expected_score(out["option_logprobs"])
  assert np.all((s >= 1) & (s <= 10))


# ----------------------------------------------------------------------------------- data and the run


def test_hh_pairs(shared_data):
  pairs = cpm.load_pairs(50, seed=0, max_chars=600, data_dir=str(shared_data))
  assert len(pairs) == 50 and len({p["index"] for p in pairs}) == 50
  assert all(p["reply_a"] != p["reply_b"] and p["history"].startswith("Human:") for p in pairs)
  labels = np.array([p["label"] for p in pairs])
  assert 10 < labels.sum() < 40                       # a fair coin puts the chosen reply first
  more = cpm.load_pairs(10, seed=0, max_chars=600, data_dir=str(shared_data), skip=50)
  assert not {p["index"] for p in more} & {p["index"] for p in pairs}


def test_tiny_run(tmp_path, shared_data):
  from iclr24_jax.configs import cpm as cfg_mod
  from iclr24_jax.papers.cpm import experiment
  c = cfg_mod.get_config("tiny")
  c.cache_dir = str(tmp_path / "cache")
  c.data.data_dir = str(shared_data)
  res = experiment.run(c, str(tmp_path / "run"))
  assert os.path.exists(tmp_path / "run" / "results.json")
  acc = res["preference"]["acc"]
  assert {"CPM", "standard PM", "length only", "CPM without length"} <= set(acc)
  assert all(0.0 <= v["mean"] <= 1.0 and len(v["per_seed"]) == c.num_seeds for v in acc.values())
  assert res["synthetic"]["acc_bayes"]["mean"] > 0.6
  assert set(res["bon"]) >= {"CPM", "standard PM"} and res["bon"]["CPM"]["n"] == [1, 2, 4]
  assert all(a[0] == 1.0 for a in res["bon"]["CPM"]["agreement"])   # n = 1: both models pick the only sample
  with open(tmp_path / "run" / "results.json") as f:
    assert json.load(f)["preference"]["num_train"] == 40
  for k in ("CPM", "standard PM"):   # per prompt at n = all 4 samples; averaged over prompts = the curve's last point
    b = res["bon"][k]
    np.testing.assert_allclose(np.mean(b["agree_prompt"], 1), [a[-1] for a in b["agreement"]], rtol=1e-6)
    np.testing.assert_allclose(np.mean(b["gap_prompt"], 1),
                               [a[-1] - s[-1] for a, s in zip(b["score_a"], b["score_b"])], rtol=1e-5, atol=1e-6)
  bj = res["bon_judge"]
  assert set(bj["win"]) == {"CPM", "standard PM"} and len(bj["head_to_head"]) == c.bon.num_prompts
  assert all(w in (0.0, 0.5, 1.0) for v in bj["win"].values() for w in v)
  assert len(bj["human_agreement"]) == c.bon.judge_check_pairs
  assert os.path.exists(tmp_path / "cache" / "judge.jsonl")
  pm = res["preference"]["pair_mean"]
  assert len(pm["CPM"]) == res["preference"]["num_pairs"] == len(res["preference"]["test_count"])


# ------------------------------------------------------------------- judging over pairs / prompts, the judge LM


def test_preference_study_pair_means_add_up_to_the_split_accuracies():
  from iclr24_jax.configs import cpm as cfg_mod
  from iclr24_jax.papers.cpm import data as data_lib
  from iclr24_jax.papers.cpm import evaluation
  d = data_lib.make_synthetic(0, 48, cfg_mod.SYN_WEIGHTS, embed_dim=8)   # 13 "LM features" + length
  cv = cfg_mod.get_config("tiny").cv
  seeds = (0, 1, 2)
  out = evaluation.preference_study(d["fa"], d["fb"], None, None, d["labels"], 24, seeds, cv)
  # Each split tests the 24 pairs after its permutation's first 24 (the study's split rule, re-drawn here).
  count = np.zeros(48, int)
  for s in seeds:
    count[np.random.default_rng(1000 + s).permutation(48)[24:]] += 1
  np.testing.assert_array_equal(out["test_count"], count)
  for k in ("CPM", "length only"):
    pm = out["pair_mean"][k]
    assert np.all(np.isnan(pm) == (count == 0))
    # sum over pairs of (mean over the splits testing it) x (splits testing it) = sum over splits of the split's
    # correct count = sum_s acc_s x 24 (acc_s is a float32 mean: the float32 reduction tolerance).
    np.testing.assert_allclose(np.nansum(pm * count), np.sum(out["acc"][k]) * 24, rtol=1e-6)


def test_paired_bootstrap_row_by_hand():
  from iclr24_jax.common import stats
  from iclr24_jax.papers.cpm import study
  kw = dict(experiment="e", metric="m", name_a="A", name_b="B", unit="pairs", paper_value="-", basis="'x' (abstract)")
  # A right on all 20 items, B wrong on all: every resample's difference is exactly 1.
  row = study.paired_bootstrap_row(a=np.ones(20), b=np.zeros(20), kind="claim", **kw)
  assert row["holds"] == "yes" and row["judgement"]["lo"] == row["judgement"]["hi"] == 1.0
  assert stats.row_kind(row) == "claim"
  # Equal arms: every difference is 0 -> the interval [0, 0] contains 0 -> inconclusive.
  x = np.random.default_rng(0).integers(0, 2, 30).astype(float)
  assert study.paired_bootstrap_row(a=x, b=x, kind="claim", **kw)["holds"] == "inconclusive"
  # The verdict is stats.bootstrap_diff's; the per-seed numbers only go to the notes: diffs 0.1, 0, 0.05 ->
  # mean 0.05, sd 0.05, SE 0.05 / sqrt(3) = 0.0289 < 0.05 / 2 -> 'inconclusive' by 2 SE.
  y = np.random.default_rng(1).integers(0, 2, 30).astype(float)
  row = study.paired_bootstrap_row(a=x, b=y, kind="claim", a_by_seed=[0.6, 0.5, 0.55], b_by_seed=[0.5, 0.5, 0.5],
                                   **kw)
  ref = stats.bootstrap_diff(x, y, paired=True, direction="greater")
  assert row["holds"] == ref["holds"] and row["judgement"]["lo"] == ref["lo"] and row["judgement"]["hi"] == ref["hi"]
  np.testing.assert_allclose(row["judgement_seeds"]["se_diff"], 0.05 / np.sqrt(3), rtol=1e-12)
  assert row["judgement_seeds"]["holds"] == "inconclusive" and "inconclusive by 2 SE" in row["notes"]
  m = study.paired_bootstrap_row(a=np.ones(20), b=np.zeros(20), kind="measurement", **kw)
  assert m["holds"] is None and stats.row_kind(m) == "measurement"


def _prefers_good(prompt: str, option: str) -> float:
  """A content-following fake judge: +2 for the option naming the answer that contains 'GOOD'."""
  first = prompt.split("[Answer of Assistant 1]")[1].split("[Answer of Assistant 2]")[0]
  second = prompt.split("[Answer of Assistant 2]")[1]
  good = {"Assistant 1": "GOOD" in first, "Assistant 2": "GOOD" in second}
  return 2.0 if good[option] and not all(good.values()) else 0.0


def test_judge_preferences_are_order_debiased_and_cached(tmp_path):
  from iclr24_jax import lm
  from iclr24_jax.papers.cpm import evaluation
  hist = ["Human: hi", "Human: help"]
  judge = lm.FakeJudge(preference=_prefers_good, noise=0.0)
  cache = lm.GenerationCache(str(tmp_path / "judge.jsonl"))
  pref = evaluation.judge_preferences(judge, hist, ["GOOD one", "bad one"], ["bad two", "GOOD two"], cache=cache)
  # Order ab: log-softmax(2, 0) -> log-odds 2 for the first answer; order ba: the same 2 for it -> mean 2.
  np.testing.assert_allclose(pref, [2.0, -2.0], atol=1e-6)
  n_calls = len(judge.calls)
  again = evaluation.judge_preferences(judge, hist, ["GOOD one", "bad one"], ["bad two", "GOOD two"],
                                       cache=lm.GenerationCache(str(tmp_path / "judge.jsonl")))
  np.testing.assert_allclose(again, pref)
  assert len(judge.calls) == n_calls                       # read back from the file, the judge not called
  positional = lm.FakeJudge(preference=lambda p, o: 3.0 if o == "Assistant 1" else 0.0, noise=0.0)
  pos = evaluation.judge_preferences(positional, hist, ["GOOD one", "bad one"], ["bad two", "GOOD two"])
  np.testing.assert_allclose(pos, 0.0, atol=1e-6)          # a purely positional judge cancels exactly
  np.testing.assert_array_equal(evaluation.pairwise_wins(np.array([2.0, -2.0, 0.0, 5.0]),
                                                         np.array([False, False, False, True])), [1.0, 0.0, 0.5, 0.5])
  with pytest.raises(ValueError, match="one first and one second answer per history"):
    evaluation.judge_preferences(judge, hist, ["a"], ["b", "c"])


def test_bon_judge_study_by_hand():
  from iclr24_jax import lm
  from iclr24_jax.configs import cpm as cfg_mod
  from iclr24_jax.papers.cpm import evaluation
  rng = np.random.default_rng(0)
  fa, fb = rng.normal(size=(64, 14)), rng.normal(size=(64, 14))
  y = (fa[:, 0] > fb[:, 0]).astype(np.int32)          # only feature 0 matters: both models weight it > 0
  # Samples differ in feature 0 only, so each model picks the argmax of its own feature 0.
  cpm_f0 = np.array([[0, 1, 3, 2], [3, 0, 1, 2], [0, 1, 2, 3]], float)     # CPM picks 2, 0, 3
  pm_f0 = np.array([[0, 3, 1, 2], [0, 1, 3, 2], [3, 0, 1, 2]], float)      # PM picks 1, 2, 0
  sf, se = np.zeros((3, 4, 14)), np.zeros((3, 4, 14))
  sf[..., 0], se[..., 0] = cpm_f0, pm_f0
  good = {(0, 2), (1, 0), (2, 0)}
  samples = [[("GOOD" if (i, j) in good else "bad") + f" {i}{j}" for j in range(4)] for i in range(3)]
  judge = lm.FakeJudge(preference=_prefers_good, noise=0.0)
  out = evaluation.bon_judge_study(fa, fb, fa, fb, y, sf, se, ["Human: q"] * 3, samples, judge,
                                   cfg_mod.get_config("tiny").cv)
  np.testing.assert_array_equal(out["picks"]["CPM"], [2, 0, 3])
  np.testing.assert_array_equal(out["picks"]["standard PM"], [1, 2, 0])
  # vs sample 0: prompt 0 CPM's GOOD pick beats 'bad' (1); prompt 1 CPM picks sample 0 itself (1/2, not judged);
  # prompt 2 CPM's 'bad' loses to the GOOD sample 0 (0). PM: two 'bad' answers tie (1/2); 'bad' loses to GOOD
  # (0); PM picks sample 0 (1/2). Head to head: GOOD vs bad (1), GOOD vs bad (1), bad vs GOOD (0).
  np.testing.assert_array_equal(out["win"]["CPM"], [1.0, 0.5, 0.0])
  np.testing.assert_array_equal(out["win"]["standard PM"], [0.5, 0.0, 0.5])
  np.testing.assert_array_equal(out["head_to_head"], [1.0, 1.0, 0.0])
  assert out["num_judged"] == 2 + 2 + 3
