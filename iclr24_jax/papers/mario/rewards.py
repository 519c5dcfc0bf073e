"""MaRio's rationale rewards: diversity, consistency, plausibility, task accuracy.

A response is "RATIONALE So the answer is ANSWER." (the official format, mario/main_n_new.py). Every reward is a
host-side function over strings returning one float per response; the LM-based ones (consistency,
plausibility) read a frozen causal LM by log-probabilities over answer options (`lm.choice_logprobs`), never by
parsing its text.

  mario.diversity_reward("a b a b a b")                       # (1 - rep2) (1 - rep3) (1 - rep4)
  mario.consistency_reward(params, config, tok, questions, rationales, golds, choices)   # [N] in [-1, 1]
  mario.plausibility_reward(params, config, tok, questions, rationales)                  # [N] in (0, 1)
  mario.accuracy_reward(responses, golds)                                                # [N] in {0, 1}
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from iclr24_jax.lm import scoring

ANSWER_MARKER = "So the answer is"
REWARD_NAMES = ("plausibility", "diversity", "consistency", "accuracy")


def split_response(response: str) -> tuple[str, str]:
  """(rationale, predicted answer) of a response "RATIONALE So the answer is ANSWER.".

  As the official code: the rationale is the text before the first "So the answer is" (stripped); the answer is
  the text after it, stripped of spaces and a final period, lower-cased; '' when the marker is missing.
  """
  if not isinstance(response, str):
    raise TypeError(f"a response must be a str, got {type(response).__name__}.")
  head, sep, tail = response.partition(ANSWER_MARKER)
  answer = tail.strip().strip(".").strip().lower() if sep else ""
  return head.strip(), answer


def format_response(rationale: str, answer: str) -> str:
  """The training target: "RATIONALE. So the answer is ANSWER." (the official PromptDataset adds the period).

  Args:
    rationale: the rationale text (a final period is added when missing).
    answer: the answer text, e.g. 'yes' or '(A)'.

  Returns:
    The response string.
  """
  rationale = rationale.strip()
  if rationale and not rationale.endswith("."):
    rationale += "."
  return f"{rationale} {ANSWER_MARKER} {answer}."


def repetition_rates(text: str) -> dict[int, float]:
  """Repeated n-gram rate 1 - unique / total of the whitespace tokens, for n = 2, 3, 4.

  As the official `compute_repetition`: counting stops at the first n with no n-gram, and the missing rates are 0.

  Returns:
    {2: rep_2, 3: rep_3, 4: rep_4}.
  """
  words = text.strip().split()
  rates = {2: 0.0, 3: 0.0, 4: 0.0}
  for n in (2, 3, 4):
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
      break
    rates[n] = 1.0 - len(set(grams)) / len(grams)
  return rates


def diversity_reward(text: str) -> float:
  """Diversity of a rationale: prod_{n=2,3,4} (1 - repeated n-gram rate) (official reward 'diversity').

  The answer part is cut first (the official reward scores `response.split('So the answer is')[0]`).

  Args:
    text: a rationale or a whole response.

  Returns:
    float in [0, 1]; 1 for a text without a repeated 2-gram (and for texts of fewer than 2 words).
  """
  if not isinstance(text, str):
    raise TypeError(f"diversity_reward takes one str, got {type(text).__name__}.")
  rationale = text.split(ANSWER_MARKER)[0]
  r = repetition_rates(rationale)
  # official: INK-USC/RationaleMultiRewardDistillation@8f9ff58 mario/reward.py:76-91 (compute_repetition)
  return float((1.0 - r[2]) * (1.0 - r[3]) * (1.0 - r[4]))


def accuracy_reward(responses: Sequence[str], golds: Sequence[str]) -> np.ndarray:
  """Task correctness: 1 where the response's answer (after "So the answer is") equals the gold answer.

  Args:
    responses: N responses.
    golds: N gold answers ('yes' / '(A)' ...), compared lower-cased without a final period.

  Returns:
    [N] float64 of 0 / 1.
  """
  if len(responses) != len(golds):
    raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers.")
  return np.asarray([float(split_response(r)[1] == g.strip().strip(".").lower() and bool(g.strip()))
                     for r, g in zip(responses, golds)], np.float64)


def answer_prompt(question: str, rationale: str | None = None) -> str:
  """The prompt the answer models read: the question (and the rationale), then "So the answer is".

  # Deviation: the official I2O / IR2O models are T5s finetuned on each data set ("explain Q choice: ..." and
  # "Q explanation: R"); here one frozen causal LM reads both prompts.

  Args:
    question: the question.
    rationale: the rationale, or None for the question-only prompt.

  Returns:
    The prompt: a 'Question: ...' line, an 'Explanation: ...' line when `rationale` is given, then 'So the answer is'.
  """
  text = f"Question: {question.strip()}\n"
  if rationale is not None:
    text += f"Explanation: {rationale.strip()}\n"
  return text + ANSWER_MARKER


# Prompt widths of the reward LMs: one compiled scorer for nearly every prompt (shorter ones are padded).
SCORE_WIDTHS = (128, 256, 512)


def _logprobs(params, config, tokenizer, prompts, options, batch_size):
  """`choice_logprobs` on full batches only (padded with copies of the first prompt): one compiled program."""
  n = len(prompts)
  padded = list(prompts) + [prompts[0]] * (-n % batch_size)
  return scoring.choice_logprobs(params, config, tokenizer, padded, options, batch_size=batch_size,
                                 widths=SCORE_WIDTHS)[:n]


def _choice_probs(params, config, tokenizer, prompts, choices, batch_size, memo: dict | None = None):
  """[N, C] softmax over the choices of the length-normalised log-probabilities (the official rq_score).

  `memo` (a dict owned by the caller, for one frozen scorer): prompts already in it are not scored again, and the
  new ones are added (the question-only prompts repeat across the arms and rounds of a study).
  """
  if memo is not None:
    key = lambda q: (q, tuple(choices))  # noqa: E731
    todo = list(dict.fromkeys(q for q in prompts if key(q) not in memo))
    if todo:
      for q, row in zip(todo, _choice_probs(params, config, tokenizer, todo, choices, batch_size)):
        memo[key(q)] = row
    return np.stack([memo[key(q)] for q in prompts]) if prompts else np.zeros((0, len(choices)))
  options = [" " + c.strip() for c in choices]
  lengths = np.asarray([len(tokenizer.encode(o, add_bos=False)) for o in options], np.float64)
  lp = _logprobs(params, config, tokenizer, prompts, options, batch_size) / lengths
  lp = lp - lp.max(axis=1, keepdims=True)
  p = np.exp(lp)
  return p / p.sum(axis=1, keepdims=True)


def consistency_reward(params, config, tokenizer, questions: Sequence[str], rationales: Sequence[str],
                       golds: Sequence[str], choices: Sequence[str], batch_size: int = 16,
                       memo: dict | None = None) -> np.ndarray:
  """Consistency (the paper's 'rationale quality'): P(gold | q, r) - P(gold | q).

  MaRio's consistency, after Wiegreffe et al. (official mario/rq_score.py:155-189): how much the rationale raises the
  answer model's probability of the gold answer. Probabilities are a softmax over the answer choices of the
  length-normalised log-likelihoods (the official rq_score.py, continuous mode). `choice_logprobs` scores each choice
  after the prompt with one prefill (the same numbers as `lm.score_continuations` on prompt + choice).

  Args:
    params, config, tokenizer: the frozen answer LM (a `lm` Llama; SmolLM2 in the reproduction).
    questions, rationales, golds: N strings each (golds must be among `choices`).
    choices: the C answer strings shared by every question (StrategyQA ['yes', 'no'], QuaRel ['(A)', '(B)']).
    batch_size: prompts per compiled call.
    memo: optional dict (for this scorer) that keeps P(choices | q) of question-only prompts across calls.

  Returns:
    [N] float64 in [-1, 1].
  """
  n = len(questions)
  if not (len(rationales) == n and len(golds) == n):
    raise ValueError(f"consistency_reward needs N questions, rationales and golds; got {n}, {len(rationales)}, "
                     f"{len(golds)}.")
  norm = [c.strip().lower() for c in choices]
  try:
    gold_idx = np.asarray([norm.index(g.strip().strip(".").lower()) for g in golds])
  except ValueError as e:
    raise ValueError(f"every gold answer must be one of the choices {list(choices)}: {e}") from None
  if n == 0:
    return np.zeros((0,), np.float64)
  with_r = _choice_probs(params, config, tokenizer, [answer_prompt(q, r) for q, r in zip(questions, rationales)],
                         choices, batch_size)
  without = _choice_probs(params, config, tokenizer, [answer_prompt(q) for q in questions], choices, batch_size,
                          memo=memo)
  rows = np.arange(n)
  # official: INK-USC/RationaleMultiRewardDistillation@8f9ff58 mario/rq_score.py:189
  return with_r[rows, gold_idx] - without[rows, gold_idx]


PLAUSIBILITY_OPTIONS = ("(a)", "(b)")


def plausibility_prompts(rationale: str, *, question: str | None = None) -> tuple[str, str]:
  """The yes/no plausibility question in both presentation orders: ("(a) Yes (b) No", "(a) No (b) Yes").

  The judge sees the rationale alone, as the official VERA scorer does for the 'plausibility' reward
  (reward.py: `res.split('So the answer is')[0].strip()` is all VERA reads); with `question` the question
  comes first, as the official 'plausibility-w-qn' variant (question + ' ' + response).

  # Deviation: the paper scores plausibility with VERA (a finetuned T5 commonsense verifier); here a frozen
  # chat LM is asked whether the statement is plausible, read by option log-probabilities in both orders.

  Args:
    rationale: the rationale to judge.
    question: optional question shown before it, keyword-only (None: the rationale alone, the official
      'plausibility').

  Returns:
    (prompt with "(a) Yes (b) No", prompt with "(a) No (b) Yes"), ChatML user turns ending in the assistant header.
  """
  body = (f"Question: {question.strip()}\n" if question is not None else "") + (
      f"Statement: {rationale.strip()}\nIs this statement plausible and true?\n")
  ab = f"<|im_start|>user\n{body}(a) Yes\n(b) No\nReply with (a) or (b).<|im_end|>\n<|im_start|>assistant\n"
  ba = f"<|im_start|>user\n{body}(a) No\n(b) Yes\nReply with (a) or (b).<|im_end|>\n<|im_start|>assistant\n"
  return ab, ba


def plausibility_reward(params, config, tokenizer, questions: Sequence[str], rationales: Sequence[str],
                        batch_size: int = 16, with_question: bool = False) -> np.ndarray:
  """Plausibility in (0, 1): sigmoid of the order-debiased log-odds that a judge LM calls the rationale plausible.

  Both orders of the options are scored ("(a) Yes (b) No" and "(a) No (b) Yes"); `lm.debiased_preference`
  averages the two log-odds for "Yes", so a purely positional judge gets exactly 0.5. The judge reads the
  rationale alone (official VERA 'plausibility'); `with_question` adds the question ('plausibility-w-qn').

  Args:
    params, config, tokenizer: the judge (a `lm` Llama chat model; SmolLM2-135M-Instruct in the reproduction).
    questions, rationales: N strings each (the questions are read only with `with_question`).
    batch_size: prompts per compiled call.
    with_question: show the question before the rationale.

  Returns:
    [N] float64.
  """
  if len(questions) != len(rationales):
    raise ValueError(f"{len(questions)} questions but {len(rationales)} rationales.")
  if not questions:
    return np.zeros((0,), np.float64)
  pairs = [plausibility_prompts(r, question=q if with_question else None) for q, r in zip(questions, rationales)]
  lp = _logprobs(params, config, tokenizer, [p for pair in pairs for p in pair], list(PLAUSIBILITY_OPTIONS),
                 batch_size)
  lp_ab, lp_ba = lp[0::2], lp[1::2]
  # In order ab "Yes" is option (a); in order ba it is option (b): debiased log-odds for "Yes".
  pref = np.asarray(scoring.debiased_preference(lp_ab, lp_ba), np.float64)
  return 1.0 / (1.0 + np.exp(-pref))


def score_responses(params, config, tokenizer, questions: Sequence[str], responses: Sequence[str],
                    golds: Sequence[str], choices: Sequence[str], rewards: Sequence[str] = REWARD_NAMES,
                    batch_size: int = 16, memo: dict | None = None) -> dict[str, np.ndarray]:
  """Every named reward of N responses: {name: [N]} (names from REWARD_NAMES).

  Args:
    params, config, tokenizer: the frozen reward LM (used by 'consistency' and 'plausibility' only).
    questions: N questions.
    responses: N responses "RATIONALE So the answer is ANSWER." (the rationale is split off for the rewards).
    golds: N gold answers (among `choices`).
    choices: the C answer strings of the data set (e.g. ['yes', 'no']).
    rewards: which rewards to compute (a subset of REWARD_NAMES).
    batch_size: prompts per compiled LM call.
    memo: optional dict kept across calls with one scorer (question-only answer probabilities, see
      `consistency_reward`).

  Returns:
    {name: [N] float64} for every name in `rewards`.

  Raises:
    ValueError: an unknown reward name.
  """
  unknown = [r for r in rewards if r not in REWARD_NAMES]
  if unknown:
    raise ValueError(f"unknown rewards {unknown}; choose from {REWARD_NAMES}.")
  rationales = [split_response(r)[0] for r in responses]
  out: dict[str, np.ndarray] = {}
  for name in rewards:
    if name == "diversity":
      out[name] = np.asarray([diversity_reward(r) for r in rationales], np.float64)
    elif name == "accuracy":
      out[name] = accuracy_reward(responses, golds)
    elif name == "consistency":
      out[name] = consistency_reward(params, config, tokenizer, questions, rationales, golds, choices, batch_size,
                                     memo=memo)
    else:
      out[name] = plausibility_reward(params, config, tokenizer, questions, rationales, batch_size)
  return out
