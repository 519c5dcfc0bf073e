"""Prompt-reconstruction metrics as the official evaluation computes them (vec2text `BaseTrainer.
_text_comparison_metrics`, trainers/base.py:263-353): BLEU, token F1 and exact match, averaged over examples.

- BLEU: `evaluate.load("sacrebleu").compute(predictions=[p], references=[r])["score"]` per example, i.e.
  sacrebleu's corpus BLEU of a single sentence with its defaults: '13a' tokenization, case-sensitive, n-grams up to
  4, 'exp' smoothing (an order with no match counts 100 / (2^k total), k = such orders so far), NO effective order
  (an order the hypothesis is too short for has precision 0, so a prediction of fewer than 4 tokens scores 0),
  brevity penalty exp(1 - r / c) when the hypothesis is shorter, 0 when no n-gram matches at all.
  `effective_order=True` gives sacrebleu's `sentence_bleu` rule instead (orders the hypothesis is too short for
  are left out of the geometric mean); `tokenize='words'` the regular-expression words below.
- Token F1: F1 of the SETS of word tokens, case-sensitive (`lowercase=True` lower-cases both sides first).
  # Deviation: the official splits words with nltk.word_tokenize; nltk and its punkt data are not installed
  # offline, so words are runs of word characters and each other non-space character alone (`words`).
- Exact match: the two strings are equal after stripping surrounding whitespace (the official compares the
  decoded strings as they are; both sides here are decoded and stripped).
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


# sacrebleu's '13a' tokenizer (mteval-v13a.pl, WMT's), written out: a space around the punctuation and symbol
# ranges below; '.' and ',' split off unless between digits; '-' split off after a digit.
_13A_RULES = (
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
)
_13A_ENTITIES = (("&quot;", '"'), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"))


def tokenize_13a(text: str) -> list[str]:
  """Tokens of sacrebleu's default '13a' tokenizer (what the official `evaluate` sacrebleu metric uses).

  Args:
    text: one segment.

  Returns:
    The list of tokens.
  """
  line = text.rstrip().replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
  if "&" in line:
    for entity, char in _13A_ENTITIES:
      line = line.replace(entity, char)
  line = f" {line} "
  for pattern, repl in _13A_RULES:
    line = pattern.sub(repl, line)
  return line.split()


TOKENIZERS = {"13a": tokenize_13a, "words": words}


def sentence_bleu(prediction: str, reference: str, max_order: int = 4, *, effective_order: bool = False,
                  tokenize: str = "13a") -> float:
  """BLEU (0-100) of one prediction against one reference, the official rule by default (module docstring).

  Args:
    prediction: the hypothesis text.
    reference: the single reference text.
    max_order: the largest n-gram order (4).
    effective_order: leave out the orders the hypothesis has no n-grams of (sacrebleu's `sentence_bleu`); the
      official evaluation (corpus BLEU through `evaluate`) does not, so under max_order tokens scores 0.
    tokenize: '13a' (official) or 'words' (`words`).

  Returns:
    BLEU in [0, 100]; 0 for an empty hypothesis or when no n-gram matches.

  Raises:
    ValueError: an unknown tokenizer.
  """
  if tokenize not in TOKENIZERS:
    raise ValueError(f"unknown BLEU tokenizer '{tokenize}'; choose one of {sorted(TOKENIZERS)}.")
  hyp, ref = TOKENIZERS[tokenize](prediction), TOKENIZERS[tokenize](reference)
  correct, total = [], []
  for n in range(1, max_order + 1):
    h, r = _ngrams(hyp, n), _ngrams(ref, n)
    correct.append(sum(min(c, r[g]) for g, c in h.items()))
    total.append(max(len(hyp) - n + 1, 0))
  if not hyp or not any(correct):
    return 0.0  # no n-gram matches: 0 (sacrebleu returns early)
  log_sum, order, smooth = 0.0, max_order, 1.0
  for n in range(1, max_order + 1):
    if total[n - 1] == 0:
      if effective_order:
        order = n - 1
        break
      return 0.0  # official: precision 0 for an order the hypothesis is too short for, so BLEU = 0
    if correct[n - 1] == 0:
      smooth *= 2.0
      log_sum += math.log(1.0 / (smooth * total[n - 1]))
    else:
      log_sum += math.log(correct[n - 1] / total[n - 1])
  bp = 1.0 if len(hyp) >= len(ref) else math.exp(1.0 - len(ref) / len(hyp))
  return 100.0 * bp * math.exp(log_sum / order)


def token_f1(prediction: str, reference: str, *, lowercase: bool = False) -> float:
  """F1 of the sets of word tokens (official: case-sensitive; 0 when either set is empty or nothing overlaps).

  Args:
    prediction, reference: texts.
    lowercase: lower-case both texts first (the previous variant).

  Returns:
    F1 in [0, 1].
  """
  if lowercase:
    prediction, reference = prediction.lower(), reference.lower()
  p, r = set(words(prediction)), set(words(reference))
  tp = len(p & r)
  if not p or not r or tp == 0:
    return 0.0
  precision, recall = tp / len(p), tp / len(r)
  return 2 * precision * recall / (precision + recall)


def per_example(predictions: Sequence[str], references: Sequence[str], *, effective_order: bool = False,
                lowercase: bool = False, tokenize: str = "13a") -> dict[str, np.ndarray]:
  """Per-example BLEU (0-100), token F1 (0-1) and exact match (0/1), for intervals over examples.

  Args:
    predictions: N predicted prompts.
    references: the N true prompts.
    effective_order, tokenize: BLEU variants (`sentence_bleu`; defaults official).
    lowercase: lower-cased token F1 (`token_f1`; default official, case-sensitive).

  Returns:
    dict(bleu [N], token_f1 [N], exact_match [N]).
  """
  if len(predictions) != len(references):
    raise ValueError(f"{len(predictions)} predictions for {len(references)} references: pass one per example.")
  pairs = list(zip(predictions, references))
  return {"bleu": np.array([sentence_bleu(p, r, effective_order=effective_order, tokenize=tokenize)
                            for p, r in pairs]),
          "token_f1": np.array([token_f1(p, r, lowercase=lowercase) for p, r in pairs]),
          "exact_match": np.array([float(p.strip() == r.strip()) for p, r in pairs])}


def metrics(predictions: Sequence[str], references: Sequence[str], **variants) -> dict[str, float]:
  """Mean BLEU (0-100), token F1 (0-100) and exact match (percent) over examples (the paper's table units).

  Args:
    predictions: N predicted prompts.
    references: the N true prompts.
    **variants: effective_order / lowercase / tokenize of `per_example` (defaults official).

  Returns:
    dict(bleu, token_f1, exact_match).
  """
  per = per_example(predictions, references, **variants)
  return {"bleu": float(per["bleu"].mean()), "token_f1": 100.0 * float(per["token_f1"].mean()),
          "exact_match": 100.0 * float(per["exact_match"].mean())}
