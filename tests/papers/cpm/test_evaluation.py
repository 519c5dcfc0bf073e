"""CPM's evaluation (`papers/cpm/evaluation.py`): the preference study's per-pair means, the
order-debiased cached judge, the best-of-n judge study by hand."""
import numpy as np
import pytest


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
