"""Prompt-reconstruction metrics: sentence BLEU, token F1 and exact match (averaged over examples).

- BLEU: sentence-level BLEU-4 on a 0-100 scale as sacrebleu's `sentence_bleu` computes it (the official evaluation
  averages per-example scores): modified n-gram precisions for n = 1..4, 'exp' smoothing (an order with no match
  counts as 1 / (2^k * total), k = the number of such orders so far; no word matched at all gives 0), effective order (orders the hypothesis is too
  short for are left out of the geometric mean), brevity penalty exp(1 - r / c) when the hypothesis is shorter.
  # Deviation: words are split by a regular expression (runs of word characters; each other non-space character
  # alone), close to sacrebleu's '13a' tokenizer but not identical on numbers with separators.
- Token F1: the harmonic mean of precision and recall of the SETS of word tokens (vec2text's text comparison
  metric), lower-cased here.
- Exact match: the stripped strings are equal.
"""
from __future__ import annotations

import collections
import math
import re
from typing import Sequence

import numpy as np

_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
  """Word tokens of a text (runs of word characters, and each punctuation mark).

  Args:
    text: a string.

  Returns:
    The list of word tokens, in order.
  """
  return _WORD.findall(text)


def _ngrams(tokens: Sequence[str], n: int) -> collections.Counter:
  return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def sentence_bleu(prediction: str, reference: str, max_order: int = 4) -> float:
  """Sentence BLEU (0-100) with exp smoothing and effective order, as described in the module docstring.

  Args:
    prediction: the hypothesis text.
    reference: the single reference text.
    max_order: the largest n-gram order (4).

  Returns:
    BLEU in [0, 100]; 0 for an empty hypothesis.
  """
  hyp, ref = words(prediction), words(reference)
  if not hyp or not ref:
    return 0.0
  if not any(w in set(ref) for w in hyp):
    return 0.0  # no matching word at all: 0, as sacrebleu returns early
  log_sum, order, smooth = 0.0, 0, 1.0
  for n in range(1, max_order + 1):
    total = max(len(hyp) - n + 1, 0)
    if total == 0:
      break  # effective order: the hypothesis has no n-grams of this order
    h, r = _ngrams(hyp, n), _ngrams(ref, n)
    correct = sum(min(c, r[g]) for g, c in h.items())
    if correct == 0:
      smooth *= 2.0
      p = 1.0 / (smooth * total)
    else:
      p = correct / total
    log_sum += math.log(p)
    order += 1
  bp = 1.0 if len(hyp) >= len(ref) else math.exp(1.0 - len(ref) / len(hyp))
  return 100.0 * bp * math.exp(log_sum / order)


def token_f1(prediction: str, reference: str) -> float:
  """F1 of the sets of lower-cased word tokens (0 when either is empty).

  Args:
    prediction, reference: texts.

  Returns:
    F1 in [0, 1].
  """
  p, r = set(w.lower() for w in words(prediction)), set(w.lower() for w in words(reference))
  tp = len(p & r)
  if not p or not r or tp == 0:
    return 0.0
  precision, recall = tp / len(p), tp / len(r)
  return 2 * precision * recall / (precision + recall)


def per_example(predictions: Sequence[str], references: Sequence[str]) -> dict[str, np.ndarray]:
  """Per-example BLEU (0-100), token F1 (0-1) and exact match (0/1), for intervals over examples.

  Args:
    predictions: N predicted prompts.
    references: the N true prompts.

  Returns:
    dict(bleu [N], token_f1 [N], exact_match [N]).
  """
  if len(predictions) != len(references):
    raise ValueError(f"{len(predictions)} predictions for {len(references)} references: pass one per example.")
  return {"bleu": np.array([sentence_bleu(p, r) for p, r in zip(predictions, references)]),
          "token_f1": np.array([token_f1(p, r) for p, r in zip(predictions, references)]),
          "exact_match": np.array([float(p.strip() == r.strip()) for p, r in zip(predictions, references)])}


def metrics(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
  """Mean BLEU (0-100), token F1 (0-100) and exact match (percent) over examples (the paper's table units).

  Args:
    predictions: N predicted prompts.
    references: the N true prompts.

  Returns:
    dict(bleu, token_f1, exact_match).
  """
  per = per_example(predictions, references)
  return {"bleu": float(per["bleu"].mean()), "token_f1": 100.0 * float(per["token_f1"].mean()),
          "exact_match": 100.0 * float(per["exact_match"].mean())}
