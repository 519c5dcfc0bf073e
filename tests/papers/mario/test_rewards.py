"""MARIO rewards (`papers/mario/rewards.py`): diversity by hand, answers and accuracy, consistency and
plausibility against the LM scorer."""
import numpy as np
import pytest

from iclr24_jax.lm import scoring
from iclr24_jax.papers import mario
from .helpers import CFG


def test_diversity_hand_worked():
  # no repeated n-gram -> (1 - 0)^3 = 1
  assert mario.diversity_reward("the cat sat on the mat") == 1.0
  # "a b a b a b": 2-grams ab ba ab ba ab (2 unique / 5) -> rep2 0.6; 3-grams aba bab aba bab (2/4) -> 0.5;
  # 4-grams abab baba abab (2/3) -> 1/3; diversity = 0.4 * 0.5 * (2/3) = 0.133333
  np.testing.assert_allclose(mario.diversity_reward("a b a b a b"), 0.4 * 0.5 * (2 / 3), rtol=1e-12)
  assert mario.repetition_rates("a b a b a b") == pytest.approx({2: 0.6, 3: 0.5, 4: 1 / 3})
  # "x x x": 2-grams (x x) twice -> rep2 1/2; one 3-gram -> 0; no 4-gram -> counting stops, rep4 = 0
  assert mario.diversity_reward("x x x") == 0.5
  # the answer part is cut: "a b a b" -> 2-grams ab ba ab (2/3) -> rep2 1/3, 3-grams aba bab -> 0, one 4-gram
  np.testing.assert_allclose(mario.diversity_reward("a b a b So the answer is yes."), 2 / 3, rtol=1e-12)
  assert mario.diversity_reward("") == 1.0 and mario.diversity_reward("word") == 1.0
  with pytest.raises(TypeError):
    mario.diversity_reward(["a list"])


def test_split_response_and_accuracy():
  assert mario.split_response("Cats swim. So the answer is Yes.") == ("Cats swim.", "yes")
  assert mario.split_response("no marker here") == ("no marker here", "")
  assert mario.format_response("Cats swim", "yes") == "Cats swim. So the answer is yes."
  acc = mario.accuracy_reward(["R. So the answer is yes.", "R. So the answer is (B).", "R. the answer: yes"],
                              ["yes", "(A)", "yes"])
  np.testing.assert_array_equal(acc, [1.0, 0.0, 0.0])
  with pytest.raises(ValueError, match="gold"):
    mario.accuracy_reward(["a"], [])


def test_consistency_equals_score_continuations(params, tok):
  """P(gold | q, r) - P(gold | q), softmax over the length-normalised choice log-likelihoods, recomputed from
  lm.score_continuations (prompt + " choice")."""
  qs = ["Can a cat swim?", "Is the sun a planet?", "Do fish breathe air?"]
  rs = ["Cats can swim.", "The sun is a star.", "Fish use gills."]
  golds = ["yes", "no", "no"]
  choices = ("yes", "no")
  got = mario.consistency_reward(params, CFG, tok, qs, rs, golds, choices, batch_size=4)

  def probs(prompts):
    cols = []
    for c in choices:
      s = scoring.score_continuations(params, CFG, tok, prompts, [" " + c] * len(prompts))
      cols.append(s["mean_logprob"])
    lp = np.stack(cols, 1)
    p = np.exp(lp - lp.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)

  from iclr24_jax.papers.mario import rewards
  with_r = probs([rewards.answer_prompt(q, r) for q, r in zip(qs, rs)])
  without = probs([rewards.answer_prompt(q) for q in qs])
  gi = np.array([0, 1, 1])
  np.testing.assert_allclose(got, with_r[np.arange(3), gi] - without[np.arange(3), gi], atol=1e-5)
  assert np.all(np.abs(got) <= 1.0)
  with pytest.raises(ValueError, match="choices"):
    mario.consistency_reward(params, CFG, tok, qs[:1], rs[:1], ["maybe"], choices)
  # The memo of question-only probabilities: same numbers, filled once, reused (a repeated question included).
  memo = {}
  first = mario.consistency_reward(params, CFG, tok, qs + qs[:1], rs + rs[1:2], golds + golds[:1], choices,
                                   batch_size=4, memo=memo)
  assert len(memo) == 3
  np.testing.assert_allclose(first[:3], got, atol=1e-6)
  memo[(rewards.answer_prompt(qs[0]), choices)] = np.asarray([1.0, 0.0])   # a planted value must be read back
  again = mario.consistency_reward(params, CFG, tok, qs[:1], rs[:1], golds[:1], choices, batch_size=4, memo=memo)
  np.testing.assert_allclose(again, with_r[0, 0] - 1.0, atol=1e-5)


def test_plausibility_is_debiased_log_odds(params, tok):
  qs, rs = ["Can a cat swim?", "Is the sun a planet?"], ["Cats can swim.", "The sun is a star."]
  got = mario.plausibility_reward(params, CFG, tok, qs, rs, batch_size=4)
  ab, ba = zip(*[mario.plausibility_prompts(r) for r in rs])
  lp_ab = scoring.choice_logprobs(params, CFG, tok, list(ab), ["(a)", "(b)"])
  lp_ba = scoring.choice_logprobs(params, CFG, tok, list(ba), ["(a)", "(b)"])
  # "Yes" is (a) in order ab and (b) in order ba: log-odds for Yes = ((a - b)_ab + (b - a)_ba) / 2
  pref = 0.5 * ((lp_ab[:, 0] - lp_ab[:, 1]) + (lp_ba[:, 1] - lp_ba[:, 0]))
  np.testing.assert_allclose(got, 1 / (1 + np.exp(-pref)), atol=1e-5)
  assert "(a) Yes\n(b) No" in ab[0] and "(a) No\n(b) Yes" in ba[0]
  # the judge sees the rationale alone (official VERA 'plausibility'); the question only on request
  # ('plausibility-w-qn'), and then the score changes with it
  assert all(q not in p for q in qs for p in ab + ba) and "Cats can swim." in ab[0]
  with_q = mario.plausibility_prompts(rs[0], question=qs[0])
  assert with_q[0].index(qs[0]) < with_q[0].index(rs[0])
  got_q = mario.plausibility_reward(params, CFG, tok, qs, rs, batch_size=4, with_question=True)
  assert np.abs(got_q - got).max() > 0                       # a random model: tiny, but the question is read
  with pytest.raises(TypeError):
    mario.plausibility_prompts(qs[0], rs[0])                  # the question is keyword-only: no silent swap
