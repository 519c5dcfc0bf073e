"""The 13 CPM features, their prompts, the score parser and the length feature.

A feature is a question about one reply in context ("does the reply {attribute_desc}?"), scored 1-10 by a
prompted LM. The attribute texts are the official ones (dongyoung-go/CPM `utils/constant.py`); the prompt is
the official HH-RLHF template (`utils/common.py:HH_TEMPLATE`) with its parts reordered so that the
conversation and the reply come first and the feature question last:

  prefix (shared by the 13 features)  = instructions + conversation + reply
  suffix (one per feature)            = the feature question + "Answer:"

so an LM scores all 13 questions after one prefill of the prefix (`lm.score_suffixes` / the KV cache).
# Deviation: the official template states the feature question before the conversation; here it comes after
# (same words), so the 13 questions share one prefix. The chat wrapping (ChatML, for SmolLM2-Instruct) is
# also ours: the official feature extractors were Flan-T5 (plain text) and GPT-3.5 (chat).
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

import numpy as np

# The official attribute texts (utils/constant.py). Keys are the official feature names with two official
# typos normalised ('biased:' -> 'biased', 'repetetive' -> 'repetitive'); OFFICIAL_NAMES keeps the originals.
FEATURE_TEXTS: dict[str, dict[str, str]] = {
    "helpfulness": dict(attribute_desc="is helpful for the original poster", attr_min="not helpful",
                        attr_max="very helpful"),
    "specificity": dict(attribute_desc="is specific enough", attr_min="too vague", attr_max="very specific"),
    "intent": dict(attribute_desc="understands the original poster's intent", attr_min="failure of understanding",
                   attr_max="perfect understanding"),
    "factuality": dict(attribute_desc="is factually correct", attr_min="egregiously incorrect",
                       attr_max="fully correct"),
    "easy-to-understand": dict(attribute_desc="is easy to understand", attr_min="very difficult to understand",
                               attr_max="very easy to understand"),
    "relevance": dict(attribute_desc="is relevant to the original poster's question", attr_min="off-topic",
                      attr_max="very relevant"),
    "readability": dict(attribute_desc="is easy to read and not too technical for the original poster",
                        attr_min="very difficult to read", attr_max="very easy to read"),
    "enough-detail": dict(attribute_desc="provides enough detail to be helpful", attr_min="too little detail",
                          attr_max="very detailed"),
    "biased": dict(attribute_desc="is biased or one-sided", attr_min="very biased", attr_max="not biased at all"),
    "fail-to-consider-individual-preferences": dict(
        attribute_desc="fails to consider the original poster's cultural or individual preferences",
        attr_min="takes into account the original poster's preferences",
        attr_max="fails to consider the original poster's preferences"),
    "repetitive": dict(attribute_desc="is repetitive", attr_min="very repetitive", attr_max="not repetitive"),
    "fail-to-consider-context": dict(attribute_desc="fails to consider the original poster's context",
                                     attr_min="fails to consider the original poster's context",
                                     attr_max="takes into account the original poster's context"),
    "too-long": dict(attribute_desc="is too long", attr_min="too long", attr_max="not too long"),
}
FEATURES: tuple[str, ...] = tuple(FEATURE_TEXTS)
OFFICIAL_NAMES = dict(zip(FEATURES, ('helpfulness', 'specificity', 'intent', 'factuality', 'easy-to-understand',
                                     'relevance', 'readability', 'enough-detail', 'biased:',
                                     'fail-to-consider-individual-preferences', 'repetetive',
                                     'fail-to-consider-context', 'too-long')))
LENGTH_FEATURE = "length"
ALL_FEATURES: tuple[str, ...] = FEATURES + (LENGTH_FEATURE,)   # the 14 columns CPM is fitted on (official)
SCORES: tuple[str, ...] = tuple(str(i) for i in range(1, 11))  # the answer options "1".."10"

# The official HH template (utils/common.py), split into the shared prefix and the per-feature suffix. The
# official template writes "Human:\n{history}"; here the history is the HH transcript with its own "Human:" /
# "Assistant:" turn labels, so the header is not repeated.
PREFIX_TEMPLATE = ("You will be given a conversation between a human and an AI assistant. Here's the "
                   "conversation:\n\n{history}\n\nAssistant:\n{reply}\n\n")
SUFFIX_TEMPLATES = {
    # The official question and answer instruction, word for word.
    "official": ("Your job is to judge whether assistant's reply {attribute_desc}. Score that on a scale from 1 "
                 "to 10 where 1 means {attr_min} and 10 means {attr_max}.\n\nAnswer by outputting a number from "
                 "1 to 10 (and nothing else)."),
    # Deviation: the reproduction's shorter wording (the same attribute texts; ~40% fewer tokens for each of the
    # 13 questions per reply, the dominant cost on CPU). The answer format is imposed by reading the digits'
    # probabilities, so the "(and nothing else)" instruction is dropped.
    "short": "Judge whether the assistant's reply {attribute_desc}. Score 1 ({attr_min}) to 10 ({attr_max}).",
}
DEFAULT_TEMPLATE = "official"

_SCORE = re.compile(r"^\s*(\d+)")


def _check_feature(feature: str) -> None:
  if feature not in FEATURE_TEXTS:
    raise ValueError(f"unknown feature {feature!r}; choose one of {FEATURES} (the length feature is computed, "
                     "not prompted: use length_feature).")


def prompt_parts(feature: str, history: str, reply: str, template: str = DEFAULT_TEMPLATE) -> tuple[str, str]:
  """The (prefix, suffix) of a feature prompt, plain text (no chat wrapping).

  Args:
    feature: one of FEATURES.
    history: the conversation before the reply.
    reply: the assistant's reply being judged.
    template: a key of SUFFIX_TEMPLATES ('official' or 'short').

  Returns:
    (prefix, suffix): the prefix is the same for every feature; prefix + suffix is `feature_prompt` without
    the trailing "\\n\\nAnswer:".
  """
  _check_feature(feature)
  if template not in SUFFIX_TEMPLATES:
    raise ValueError(f"template must be one of {tuple(SUFFIX_TEMPLATES)}, got {template!r}.")
  prefix = PREFIX_TEMPLATE.format(history=history.strip(), reply=reply.strip())
  return prefix, SUFFIX_TEMPLATES[template].format(**FEATURE_TEXTS[feature])


def feature_prompt(feature: str, history: str, reply: str, template: str = DEFAULT_TEMPLATE) -> str:
  """The plain-text prompt that asks an LM to score one feature of a reply (the official HH template, with the
  question after the conversation).

  Args:
    feature: one of FEATURES.
    history: the conversation before the reply ("Human: ... Assistant: ... Human: ...").
    reply: the reply being judged.
    template: 'official' (default) or 'short'.

  Returns:
    The prompt, ending with "Answer:".
  """
  prefix, suffix = prompt_parts(feature, history, reply, template)
  return prefix + suffix + "\n\nAnswer:"


def chat_parts(feature: str, history: str, reply: str, tokenizer=None, system: str | None = None,
               template: str = DEFAULT_TEMPLATE) -> tuple[str, str]:
  """The feature prompt as ChatML for an instruction-tuned LM, split at the feature question.

  The user turn holds prefix + suffix; the assistant turn is opened so the next token is the score.

  Args:
    feature, history, reply: as in `feature_prompt`.
    tokenizer: an `lm.Tokenizer` with a chat template (its default system prompt is used); None renders
      plain ChatML without a system turn.
    system: an explicit system prompt (overrides the template's default).
    template: 'official' or 'short' (the question's wording).

  Returns:
    (prefix, suffix) strings with prefix + suffix = the rendered chat prompt.
  """
  prefix, suffix = prompt_parts(feature, history, reply, template)
  marker = "\x00CPM_SPLIT\x00"
  messages = [{"role": "user", "content": prefix + marker + suffix}]
  if tokenizer is not None and getattr(tokenizer, "chat_template", None):
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, system=system)
  else:
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    text = f"{head}<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
  if text.count(marker) != 1:
    raise RuntimeError("the chat template changed the prompt text; cannot split it at the feature question.")
  a, b = text.split(marker)
  return a, b


def parse_score(text: str | None) -> int | None:
  """The official parser: the integer at the start of the LM's answer, if it is in 1..10.

  Args:
    text: the generated answer (e.g. "7", " 8/10", "10.").

  Returns:
    The score 1..10, or None when the answer does not start with a number (unparseable -> missing; the
    official regex is `^\\d+` on the answer) or the number is outside 1..10.
  """
  if text is None:
    return None
  m = _SCORE.match(text)
  if not m:
    return None
  # Deviation: the official parser keeps any leading integer (e.g. "0" or "85"); a score outside the asked
  # 1..10 range is treated as missing here.
  value = int(m.group(1))
  return value if 1 <= value <= 10 else None


def length_feature(replies: Sequence[str]) -> np.ndarray:
  """The official length feature: characters / 100 (mle-train/fit_logistic.py FEATURE_CALLBACKS).

  Args:
    replies: M reply strings.

  Returns:
    [M] float64.
  """
  return np.asarray([len(r) / 100.0 for r in replies], np.float64)


def expected_score(option_logprobs: np.ndarray) -> np.ndarray:
  """The expected score under an LM's distribution over the options "1".."10" (renormalised over them).

  Args:
    option_logprobs: [..., 10] log-probabilities of the answers "1".."10" (any normalisation).

  Returns:
    [...] expected score in [1, 10].
  """
  lp = np.asarray(option_logprobs, np.float64)
  if lp.shape[-1] != len(SCORES):
    raise ValueError(f"expected_score needs [..., {len(SCORES)}] option log-probabilities, got {lp.shape}.")
  if not np.all(np.isfinite(lp) | (lp == -np.inf)) or np.all(lp == -np.inf, axis=-1).any():
    raise ValueError("option log-probabilities must be finite (or -inf) with at least one finite option.")
  p = np.exp(lp - lp.max(axis=-1, keepdims=True))
  p /= p.sum(axis=-1, keepdims=True)
  return p @ np.arange(1, len(SCORES) + 1, dtype=np.float64)


def split_dialogue(text: str) -> tuple[str, str]:
  """Splits an HH-RLHF transcript at its last "\\n\\nAssistant:" turn.

  Args:
    text: "\\n\\nHuman: ... \\n\\nAssistant: ..." as in the HH-RLHF files.

  Returns:
    (history, reply): the transcript before the last assistant turn (stripped) and that turn's text.
  """
  key = "\n\nAssistant:"
  i = text.rfind(key)
  if i < 0:
    raise ValueError(f"not an HH-RLHF transcript (no '{key.strip()}' turn): {text[:80]!r}.")
  return text[:i].strip(), text[i + len(key):].strip()


def feature_matrix(scores: Mapping[str, np.ndarray], replies: Sequence[str] | None = None,
                   names: Sequence[str] = ALL_FEATURES) -> np.ndarray:
  """Stacks per-feature score vectors (and the computed length feature) into a matrix.

  Args:
    scores: {feature: [M] scores} (NaN = missing).
    replies: the M replies (needed when `names` includes 'length').
    names: the columns, in order.

  Returns:
    [M, len(names)] float64.
  """
  cols = []
  for name in names:
    if name == LENGTH_FEATURE:
      if replies is None:
        raise ValueError("the 'length' feature needs the replies.")
      cols.append(length_feature(replies))
    else:
      if name not in scores:
        raise KeyError(f"no scores for feature {name!r}; have {sorted(scores)}.")
      cols.append(np.asarray(scores[name], np.float64))
  return np.stack(cols, axis=1)
