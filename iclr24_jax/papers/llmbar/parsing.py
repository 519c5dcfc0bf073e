"""Answer parsing, the swap mapping, and the relabelling of explanations for swap-and-synthesize."""
from __future__ import annotations

import re

from iclr24_jax.papers.llmbar import prompts

_DIRECT = {k: re.compile(v) for k, v in prompts.DIRECT_PATTERNS.items()}
_COT = {k: re.compile(v) for k, v in prompts.COT_PATTERNS.items()}
_STRICT_INT = re.compile(r"^\s*([+-]?[0-9]+)\s*$")
_ANY_INT = re.compile(r"(?<![0-9])([0-9]+)(?![0-9])")
_AB = re.compile(r"\b([Oo]utput) \(([ab])\)")

ORDERS = {"original": 0, "swapped": 1}


def parse_answer(text: str, mode: str = "direct") -> int | None:
  """Which output a judge's answer picks, by the official regexes (label 1's pattern is tried first).

  Args:
    text: the judge's completion.
    mode: 'direct' ("Output (a)" / "Output (b)" at the start of the text or of a line, optionally after one
      space) or 'cot' ("Output (a) is better." anywhere, as the CoT prompt asks the answer to end with).

  Returns:
    1 for Output (a), 2 for Output (b) (in the order shown to the judge), None when neither matches (a parse
    failure, counted as wrong). Case matters ("output (a)" does not count), as in the official code.
  """
  if not isinstance(text, str):
    raise TypeError(f"parse_answer expects a str, got {type(text).__name__}.")
  if mode == "direct":
    patterns = _DIRECT
  elif mode == "cot":
    patterns = _COT
  else:
    raise ValueError(f"mode must be 'direct' or 'cot', got {mode!r}.")
  text = text.strip()
  # official: princeton-nlp/LLMBar@900616b LLMEvaluator/evaluate.py:264-271 (completion_with_parsing)
  for label in (1, 2):
    if patterns[label].search(text):
      return label
  return None


def parse_rating(text: str, strict: bool = True) -> int | None:
  """The integer score a rating judge gave (the official code calls `int(completion)`).

  Args:
    text: the judge's completion.
    strict: True (official): the whole stripped text must be one integer. False: the first run of digits
      anywhere (e.g. 'Score: 7' -> 7), a lenient fallback for small models.

  Returns:
    The score, or None when there is no integer.
  """
  if not isinstance(text, str):
    raise TypeError(f"parse_rating expects a str, got {type(text).__name__}.")
  # official: princeton-nlp/LLMBar@900616b LLMEvaluator/evaluate.py:445 (int(completion))
  m = _STRICT_INT.match(text)
  if m:
    return int(m.group(1))
  if not strict:
    m = _ANY_INT.search(text)
    if m:
      return int(m.group(1))
  return None


def order_index(order: int | str | bool) -> int:
  """0 for the original order (output_1 shown as (a)), 1 for the swapped order ('original'/'swapped' accepted)."""
  if isinstance(order, str):
    if order not in ORDERS:
      raise ValueError(f"order must be 0/1 or 'original'/'swapped', got {order!r}.")
    return ORDERS[order]
  if int(order) not in (0, 1):
    raise ValueError(f"order must be 0 (original) or 1 (swapped), got {order!r}.")
  return int(order)


def map_back(winner: int | None, order: int | str) -> int:
  """Maps a position-level answer (1 = shown as (a), 2 = shown as (b)) to the instance's output id.

  In the swapped order output_2 is shown as (a), so 1 <-> 2; a failure (None or 0) stays 0.

  Args:
    winner: 1, 2, 0 or None (the parsed position-level pick).
    order: 0 / 'original' or 1 / 'swapped', the presentation order.

  Returns:
    1 (output_1), 2 (output_2) or 0 (no valid answer).

  Raises:
    ValueError: winner not in {None, 0, 1, 2}, or an unknown order.
  """
  if winner in (None, 0):
    return 0
  if winner not in (1, 2):
    raise ValueError(f"winner must be 1, 2, 0 or None, got {winner!r}.")
  # official: princeton-nlp/LLMBar@900616b LLMEvaluator/evaluate.py:336-344, 367 (reverse_label)
  return winner if order_index(order) == 0 else 3 - winner


def swap_output_labels(text: str) -> str:
  """Exchanges "Output (a)" and "Output (b)" (and the lower-case "output (a)/(b)") in an explanation.

  Used by swap-and-synthesize: an explanation written for one presentation order is relabelled so it refers
  to the same outputs in the order the synthesis prompt shows them.
  """
  # official: princeton-nlp/LLMBar@900616b LLMEvaluator/evaluate.py:403-409 (reverse_OutputAB)
  return _AB.sub(lambda m: f"{m.group(1)} ({'b' if m.group(2) == 'a' else 'a'})", text)
