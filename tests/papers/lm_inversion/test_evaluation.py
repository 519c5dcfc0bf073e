"""lm_inversion's metrics (`papers/lm_inversion/evaluation.py`): BLEU by hand and against
sacrebleu through the official call, token F1 and exact match by hand."""
import math

import numpy as np
import pytest

from iclr24_jax.papers import lm_inversion as li
from iclr24_jax.papers.lm_inversion import data as li_data
from .helpers import needs_data


def test_bleu_hand_worked():
  # hyp "the cat sat on the mat" vs ref "the cat sat on a mat": precisions 5/6, 3/5, 2/4, 1/3, BP 1
  # BLEU = 100 (5/6 * 3/5 * 1/2 * 1/3)^(1/4) = 100 (1/12)^(1/4) = 53.7285
  np.testing.assert_allclose(li.sentence_bleu("the cat sat on the mat", "the cat sat on a mat"),
                             100 * (1 / 12) ** 0.25, rtol=1e-9)
  assert li.sentence_bleu("the same words here", "the same words here") == pytest.approx(100.0)
  # official (sacrebleu corpus BLEU, no effective order): under 4 tokens there are no 3- or 4-grams, precision 0,
  # BLEU 0. The example "Is it" vs "Is it raining": 0.00; with effective order p1 = p2 = 1 and
  # BP = exp(1 - 3/2), so 100 e^-0.5 = 60.65.
  assert li.sentence_bleu("Is it", "Is it raining") == 0.0
  np.testing.assert_allclose(li.sentence_bleu("Is it", "Is it raining", effective_order=True),
                             100 * math.exp(-0.5), rtol=1e-12)
  # effective order, "the cat" vs "the dog": p1 = 1/2; p2 has no match -> exp smoothing 1 / (2 * 1) -> 50
  assert li.sentence_bleu("the cat", "the dog", effective_order=True) == pytest.approx(50.0)
  assert li.sentence_bleu("the cat", "the dog") == 0.0
  # 13a splits the final '?': "Is it raining?" vs "Is it raining ?" are the same 4 tokens
  assert li.sentence_bleu("Is it raining?", "Is it raining ?") == pytest.approx(100.0)
  assert li.sentence_bleu("dog", "the cat") == 0.0 and li.sentence_bleu("", "the cat") == 0.0
  with pytest.raises(ValueError, match="unknown BLEU tokenizer"):
    li.sentence_bleu("a", "a", tokenize="spacy")


@needs_data
def test_bleu_equals_sacrebleu_through_the_official_call():
  """Against sacrebleu itself, called as the official `evaluate` sacrebleu metric does (corpus_bleu of one
  sentence, defaults), on real prompts and damaged copies of them (dropped, swapped, case-changed words, cut
  short); sentence_bleu (effective order) against sacrebleu.sentence_bleu."""
  import sacrebleu
  prompts = [r["input"] for r in li_data.textdata.load_llmbar()][:80]
  prompts += [r["question"] for r in li_data.textdata.load_mario("quarel", "test")][:70]
  rng = np.random.default_rng(0)
  pairs = []
  for p in prompts:
    w = p.split()
    q = [x.upper() if rng.random() < 0.1 else x for x in w if rng.random() > 0.3]
    if len(q) > 3 and rng.random() < 0.5:
      i = rng.integers(len(q) - 1)
      q[i], q[i + 1] = q[i + 1], q[i]
    pairs.append((" ".join(q[: rng.integers(1, len(q) + 2)]), p))
  ours = [li.sentence_bleu(h, r) for h, r in pairs]
  ref = [sacrebleu.corpus_bleu([h], [[r]]).score for h, r in pairs]
  np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9)
  assert sum(0 < b < 100 for b in ref) > 50 and sum(b == 0 for b in ref) > 3   # both regimes exercised
  eff = [li.sentence_bleu(h, r, effective_order=True) for h, r in pairs]
  np.testing.assert_allclose(eff, [sacrebleu.sentence_bleu(h, [r]).score for h, r in pairs], rtol=1e-9, atol=1e-9)


def test_token_f1_and_exact_match_hand_worked():
  # sets {a, b, c} vs {b, c, d, e}: P = 2/3, R = 1/2, F1 = 2 (1/3) / (7/6) = 4/7
  assert li.token_f1("a b c", "b c d e") == pytest.approx(4 / 7)
  # official: case-sensitive sets, {A, b} vs {a, B} share nothing; lower-cased (the variant) they are equal
  assert li.token_f1("A b b", "a B") == 0.0
  assert li.token_f1("A b b", "a B", lowercase=True) == pytest.approx(1.0)
  m = li.metrics(["a b c", "Is it?", "x"], ["b c d e", "Is it?", "y"])
  assert m["exact_match"] == pytest.approx(100 / 3)
  assert m["token_f1"] == pytest.approx(100 * (4 / 7 + 1 + 0) / 3)
  # BLEU: "Is it?" is 3 tokens under 13a, so 0 officially; the two others share no word
  assert m["bleu"] == 0.0
  with pytest.raises(ValueError, match="one per example"):
    li.metrics(["a"], ["a", "b"])
