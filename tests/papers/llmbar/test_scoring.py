"""LLMBar scoring (`papers/llmbar/scoring.py`): accuracy and agreement by hand, constant and random judges,
subsets, bootstrap intervals."""
import numpy as np
import pytest

from iclr24_jax.papers import llmbar
from .helpers import _gen_eval, _inst


def test_score_hand_worked():
  # labels          1  2  1  2
  # original        1  1  0  2   -> correct T F F T = 2
  # swapped (back)  1  2  2  0   -> correct T T F F = 2
  # accuracy = (2 + 2) / (2 * 4) = 0.5; agreement: only instance 0 picks the same output in both orders = 1/4;
  # correct_both = 1/4; failures = 2 zeros of 8 judgements = 0.25.
  r = llmbar.score([1, 2, 1, 2], [1, 1, 0, 2], [1, 2, 2, 0])
  assert r["accuracy"] == 0.5 and r["agreement"] == 0.25
  assert r["accuracy_original"] == 0.5 and r["accuracy_swapped"] == 0.5
  assert r["correct_both"] == 0.25 and r["failure_rate"] == 0.25 and r["n"] == 4
  # Two failures: not an agreement for us (1 - 1 = 0 of 1), but 'equal' in the official script.
  assert llmbar.score([1], [0], [0])["agreement"] == 0.0
  assert llmbar.score([1], [0], [0], count_failures_as_agreement=True)["agreement"] == 1.0


def test_always_a_judge_is_exactly_half_and_never_agrees():
  # "Output (a)" in both orders -> original pick 1, swapped pick (a) = output_2 -> mapped back 2. Every instance
  # is right in exactly one order (label 1: the original, label 2: the swapped), so accuracy = N / (2N) = 0.5
  # whatever the label mix, and the two orders never pick the same output: agreement = 0 / N = 0.
  rng = np.random.default_rng(0)
  labels = rng.integers(1, 3, size=101)
  w_orig = np.full(101, llmbar.map_back(llmbar.parse_answer("Output (a)"), 0))
  w_swap = np.full(101, llmbar.map_back(llmbar.parse_answer("Output (a)"), 1))
  r = llmbar.score(labels, w_orig, w_swap)
  assert r["accuracy"] == 0.5 and r["agreement"] == 0.0
  # The same through evaluate with a constant judge on instances of both labels.
  insts = [_inst(1 + (i % 3 == 0), i) for i in range(9)]
  res = _gen_eval(llmbar.ConstantJudge("Output (a)"), insts, "vanilla")
  assert res["accuracy"] == 0.5 and res["agreement"] == 0.0 and res["position_a_rate"] == 1.0
  np.testing.assert_array_equal(res["winners_original"], 1)
  np.testing.assert_array_equal(res["winners_swapped"], 2)


def test_random_judge_is_near_half_half():
  # Independent uniform picks in both orders: E[accuracy] = 0.5, E[agreement] = P(same) = 0.5. With N = 20000 the
  # standard errors are sqrt(.25 / 40000) = 0.0025 and sqrt(.25 / 20000) = 0.0035; 0.02 is > 5 of them.
  rng = np.random.default_rng(0)
  n = 20000
  r = llmbar.score(rng.integers(1, 3, n), rng.integers(1, 3, n), rng.integers(1, 3, n))
  assert abs(r["accuracy"] - 0.5) < 0.02 and abs(r["agreement"] - 0.5) < 0.02


def test_score_errors():
  with pytest.raises(ValueError, match="same length"):
    llmbar.score([1, 2], [1], [1, 2])
  with pytest.raises(ValueError, match="labels must be 1 or 2"):
    llmbar.score([3], [1], [1])
  with pytest.raises(ValueError, match="winners_swapped"):
    llmbar.score([1], [1], [5])
  with pytest.raises(ValueError, match="N = 0"):
    llmbar.score([], [], [])
  with pytest.raises(ValueError, match="1-D"):
    llmbar.score([[1]], [[1]], [[1]])


def test_score_subsets_adversarial_is_mean_of_subsets():
  # Neighbor: 1 of 2 right in both orders -> 0.5; GPTInst: all right -> 1.0; the paper's 'Adversarial' is the
  # unweighted mean (0.5 + 1.0) / 2 = 0.75, not the pooled 3/4 of instances... here also 0.75 by coincidence,
  # so give GPTInst 4 instances: pooled (2 + 8) / 12 = 0.833 but the mean stays 0.75.
  per = {"Natural": dict(labels=[1], winners_original=[1], winners_swapped=[1]),
         "Neighbor": dict(labels=[1, 2], winners_original=[1, 1], winners_swapped=[1, 1]),
         "GPTInst": dict(labels=[1, 2, 1, 2], winners_original=[1, 2, 1, 2], winners_swapped=[1, 2, 1, 2])}
  out = llmbar.score_subsets(per)
  assert out["Neighbor"]["accuracy"] == 0.5 and out["GPTInst"]["accuracy"] == 1.0
  assert out["Adversarial"]["accuracy"] == 0.75 and out["Adversarial"]["n"] == 6


def test_intervals_hand_values():
  from iclr24_jax.papers.llmbar import scoring as sc
  # credit = (right original + right swapped) / 2
  np.testing.assert_array_equal(sc.item_correctness([1, 2, 1], [1, 1, 0], [1, 2, 2]), [1.0, 0.5, 0.0])
  assert sc.first_position_rate([1, 2, 1], [2, 2, 1]) == pytest.approx(4 / 6)  # (a): 2 original + 2 swapped
  ones, zeros = np.ones(10), np.zeros(12)
  per = {"Natural": ones, "Neighbor": zeros, "GPTInst": ones, "GPTOut": zeros, "Manual": zeros}
  ci = sc.subset_bootstrap(per)
  assert ci["Natural"] == (1.0, 1.0) and ci["Adversarial"] == (0.25, 0.25)  # mean of 4 subsets, no spread
  gap = sc.bootstrap_gap(per, "Natural", per, "Adversarial", paired=False)
  assert gap["diff"] == pytest.approx(0.75) and gap["holds"] == "yes" and gap["lo"] == pytest.approx(0.75)
  assert sc.bootstrap_gap(per, "Adversarial", per, "Natural", paired=False)["holds"] == "no"
  rng = np.random.default_rng(0)
  coin = {"Natural": rng.integers(0, 2, 40).astype(float)}
  same = sc.bootstrap_gap(coin, "Natural", coin, "Natural", paired=True)
  assert same["diff"] == 0.0 and same["lo"] == 0.0 == same["hi"] and same["holds"] == "inconclusive"
  noisy = sc.bootstrap_gap(coin, "Natural", {"Natural": rng.integers(0, 2, 40).astype(float)}, "Natural",
                           paired=True)
  assert noisy["lo"] < 0 < noisy["hi"] and noisy["holds"] == "inconclusive"  # two coins: no difference
