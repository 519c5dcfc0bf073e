"""LLM evaluators = a judge LLM + a prompting strategy; prompt building and the evaluation loop.

Strategies (paper names in brackets; all templates in `prompts.py`):
  vanilla                  [Vanilla]                 direct answer "Output (a)"/"Output (b)"
  rules                    [Vanilla + Rules]         + the three evaluation rules
  rules_metrics            [Rules + Metrics]         + the judge's own evaluation questions (a first LLM call)
  rules_reference          [Rules + Reference]       + the judge's own reference output (a first LLM call)
  rules_metrics_reference  [Rules + Metrics + Reference]
  cot                      [CoT (+ Rules)]           explanation, then "Therefore, Output (x) is better."
  swap                     [Swap (+ Rules)]          CoT in both orders; on conflict a synthesis prompt sees both
                                                     explanations and answers directly
  swap_cot                 [Swap + CoT]              ... and the synthesis answers with CoT
  rating, rating_norules, rating_metrics, rating_reference, rating_metrics_reference
                           [rating-based]            each output scored 0-9 on its own; higher score wins

Every comparison is judged in both orders (original: output_1 shown as (a); swapped: output_2 shown as (a)),
and the swapped answer is mapped back to output ids before scoring.
"""
from __future__ import annotations

import dataclasses
import re
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.lm import cache as cache_lib
from iclr24_jax.papers.llmbar import parsing
from iclr24_jax.papers.llmbar import prompts as P
from iclr24_jax.papers.llmbar import scoring
from iclr24_jax.papers.llmbar.data import Instance

Judge = Callable[..., list]


@dataclasses.dataclass(frozen=True)
class Strategy:
  """How an evaluator prompts and parses.

  Attributes:
    name: our key.
    paper_name: the paper's name for it.
    kind: 'compare' (one judgement per order), 'swap' (swap-and-synthesize) or 'rating'.
    template: key of the judging template in `prompts.TEMPLATES`.
    aux: auxiliary generations, in the order they fill {auxiliary_input_0}, {auxiliary_input_1}.
    answer: how the judging stage answers: 'direct', 'cot' or 'rating'.
    synthesize: template key of the synthesis stage (swap strategies).
    synth_answer: how the synthesis stage answers.
  """

  name: str
  paper_name: str
  kind: str
  template: str
  aux: tuple[str, ...] = ()
  answer: str = "direct"
  synthesize: str | None = None
  synth_answer: str | None = None


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("vanilla", "Vanilla", "compare", "vanilla"),
    Strategy("rules", "Vanilla + Rules", "compare", "rules"),
    Strategy("rules_metrics", "Rules + Metrics", "compare", "rules_metrics", ("metrics",)),
    Strategy("rules_reference", "Rules + Reference", "compare", "rules_reference", ("reference",)),
    Strategy("rules_metrics_reference", "Rules + Metrics + Reference", "compare", "rules_metrics_reference",
             ("metrics", "reference")),
    Strategy("cot", "CoT (+ Rules)", "compare", "cot", answer="cot"),
    Strategy("swap", "Swap (+ Rules)", "swap", "cot", answer="cot", synthesize="swap_synthesize",
             synth_answer="direct"),
    Strategy("swap_cot", "Swap + CoT (+ Rules)", "swap", "cot", answer="cot", synthesize="swap_cot_synthesize",
             synth_answer="cot"),
    Strategy("rating_norules", "Rating", "rating", "rating_norules", answer="rating"),
    Strategy("rating", "Rating + Rules", "rating", "rating", answer="rating"),
    Strategy("rating_metrics", "Rating + Rules + Metrics", "rating", "rating_metrics", ("metrics",), "rating"),
    Strategy("rating_reference", "Rating + Rules + Reference", "rating", "rating_reference", ("reference",),
             "rating"),
    Strategy("rating_metrics_reference", "Rating + Rules + Metrics + Reference", "rating",
             "rating_metrics_reference", ("metrics", "reference"), "rating"),
)}

# Official token budgets (evaluators/config/*.json) per call kind.
OFFICIAL_MAX_NEW_TOKENS = dict(P.OFFICIAL_MAX_NEW_TOKENS)

# Log-probability mode (ours: a small judge's generated verdict is constant): the scored answers and the tie threshold.
ANSWER_OPTIONS = ("Output (a)", "Output (b)")  # a direct answer, as the prompts ask for it
COT_OPTIONS = ("Therefore, Output (a) is better.", "Therefore, Output (b) is better.")  # the CoT prompts' ending
RATING_OPTIONS = tuple(str(i) for i in range(10))  # a rating answer: one digit 0-9
DEFAULT_TIE_TAU = 1e-4  # nats: below float32 noise of a ~1k-token forward, above an exact tie
JUDGE_MODES = ("generate", "logprob", "auto")


def get_strategy(strategy: str | Strategy) -> Strategy:
  """A Strategy by name (or itself); unknown names raise a ValueError listing the valid ones."""
  if isinstance(strategy, Strategy):
    return strategy
  if strategy not in STRATEGIES:
    raise ValueError(f"unknown strategy {strategy!r}; choose from {sorted(STRATEGIES)}.")
  return STRATEGIES[strategy]


def _check_instance(instance: Instance) -> None:
  for field in ("input", "output_1", "output_2"):
    if not isinstance(getattr(instance, field, None), str):
      raise TypeError(f"instance.{field} must be a str (an llmbar.Instance), got {type(instance).__name__}.")


def build_aux_prompt(aux_kind: str, instance: Instance) -> str:
  """The prompt of an auxiliary generation.

  Args:
    aux_kind: 'metrics' (the LLM proposes up to three evaluation questions) or 'reference' (it answers the
      instruction itself).
    instance: the instance (only its instruction is used).

  Returns:
    ChatML prompt text.
  """
  if aux_kind not in ("metrics", "reference"):
    raise ValueError(f"aux_kind must be 'metrics' or 'reference', got {aux_kind!r}.")
  _check_instance(instance)
  return P.TEMPLATES[f"aux_{aux_kind}"].format_map({"input": instance.input})


def _shown_outputs(instance: Instance, order: int) -> tuple[str, str]:
  return (instance.output_1, instance.output_2) if order == 0 else (instance.output_2, instance.output_1)


def synthesis_explanations(completions: Sequence[str], winners: Sequence[int], order: int | str) -> tuple[str, str]:
  """The two explanations a swap-and-synthesize prompt shows, relabelled for `order`.

  Args:
    completions: the stage-1 CoT completions (original order, swapped order).
    winners: the stage-1 picks mapped back to output ids (original, swapped); must be {1, 2} (a conflict).
    order: the order of the synthesis prompt (0 original, 1 swapped).

  Returns:
    (explanation shown as Assistant (a)'s, i.e. the one arguing for the output shown as (a); the one arguing
    for the output shown as (b)). An explanation written in the other order has "Output (a)" and
    "Output (b)" exchanged so it names the outputs as this prompt shows them.
  """
  o = parsing.order_index(order)
  w = [int(x) for x in winners]
  if sorted(w) != [1, 2]:
    raise ValueError(f"synthesis needs conflicting stage-1 winners {{1, 2}}, got {tuple(w)}.")
  source = {w[0]: 0, w[1]: 1}  # output id -> the order whose explanation argues for it
  def explanation_for(output_id: int) -> str:
    text = completions[source[output_id]]
    return text if source[output_id] == o else parsing.swap_output_labels(text)
  # official: princeton-nlp/LLMBar@900616b LLMEvaluator/evaluate.py:389-414
  exp_1, exp_2 = explanation_for(1), explanation_for(2)
  return (exp_1, exp_2) if o == 0 else (exp_2, exp_1)


def build_prompt(strategy: str | Strategy, instance: Instance, order: int | str,
                 aux: Mapping[str, Any] | None = None, stage: str = "judge") -> str:
  """The judging prompt of one strategy for one instance in one order.

  Args:
    strategy: a name in STRATEGIES (or a Strategy).
    instance: the instance.
    order: 0 / 'original' (output_1 shown as Output (a)) or 1 / 'swapped' (output_2 shown as Output (a)). For
      rating strategies it selects the output being scored (0: output_1, 1: output_2).
    aux: the auxiliary texts the strategy needs: {'metrics': questions, 'reference': reference output}; for
      stage='synthesize' {'completions': (cot original, cot swapped), 'winners': (w original, w swapped mapped
      back)}.
    stage: 'judge' (default) or 'synthesize' (the second step of swap strategies).

  Returns:
    ChatML prompt text (system + user turns, the official format).
  """
  s = get_strategy(strategy)
  _check_instance(instance)
  o = parsing.order_index(order)
  aux = dict(aux or {})
  if stage == "synthesize":
    if s.synthesize is None:
      raise ValueError(f"strategy {s.name!r} has no synthesis stage (only 'swap' and 'swap_cot' do).")
    for k in ("completions", "winners"):
      if k not in aux:
        raise ValueError(f"the synthesis prompt needs aux['{k}'] (the stage-1 CoT results of both orders).")
    exp_a, exp_b = synthesis_explanations(aux["completions"], aux["winners"], o)
    shown = _shown_outputs(instance, o)
    return P.TEMPLATES[s.synthesize].format_map({"input": instance.input, "output_1": shown[0], "output_2": shown[1],
                                                 "explanation_1": exp_a, "explanation_2": exp_b})
  if stage != "judge":
    raise ValueError(f"stage must be 'judge' or 'synthesize', got {stage!r}.")
  fields = {"input": instance.input}
  missing = [k for k in s.aux if not isinstance(aux.get(k), str)]
  if missing:
    raise ValueError(f"strategy {s.name!r} needs aux texts {list(s.aux)} (generate them with build_aux_prompt); "
                     f"missing {missing}.")
  for i, k in enumerate(s.aux):
    fields[f"auxiliary_input_{i}"] = aux[k]
  if s.kind == "rating":
    fields["output"] = instance.output_1 if o == 0 else instance.output_2
  else:
    fields["output_1"], fields["output_2"] = _shown_outputs(instance, o)
  return P.TEMPLATES[s.template].format_map(fields)


# --------------------------------------------------------------------------------------------- generation


def _judge_settings(judge: Judge, kind: str) -> dict:
  fn = getattr(judge, "decoding_settings", None)
  return dict(fn(kind)) if callable(fn) else {}


def call_judge(judge: Judge, prompts: Sequence[str], max_new_tokens: int, kind: str,
               cache: cache_lib.GenerationCache | None = None, model_id: str | None = None, chunk_size: int = 64,
               progress: metrics_lib.Progress | None = None, counter: list | None = None) -> list[str]:
  """Runs a judge over prompts with caching and resumability.

  Identical prompts are generated once; cached answers are reused; the rest are sent in chunks (shortest
  first), each chunk appended to the cache as soon as it is done.

  Args:
    judge: `judge(prompts, max_new_tokens)` (or with `kind=` when `judge.accepts_kind`).
    prompts: ChatML prompts.
    max_new_tokens: token budget of this call kind.
    kind: 'metrics', 'reference', 'direct', 'cot' or 'rating'.
    cache: optional GenerationCache.
    model_id: cache-key name of the judge (default `judge.model_id`).
    chunk_size: prompts per judge call.
    progress: optional Progress, advanced by the number of prompts answered.
    counter: optional one-element list accumulating answered prompts (for progress).

  Returns:
    One answer per prompt.
  """
  if isinstance(prompts, str):
    raise TypeError("call_judge takes a list of prompts, got one str; wrap it in a list.")
  model_id = model_id or getattr(judge, "model_id", None)
  settings = {"kind": kind, "max_new_tokens": int(max_new_tokens), **_judge_settings(judge, kind)}

  def fn(texts: list[str]) -> list[str]:
    if getattr(judge, "accepts_kind", False):
      out = judge(texts, int(max_new_tokens), kind=kind)
    else:
      out = judge(texts, int(max_new_tokens))
    if not isinstance(out, (list, tuple)) or len(out) != len(texts) or not all(isinstance(x, str) for x in out):
      raise ValueError(f"the judge must return a list of {len(texts)} strings, got {type(out).__name__} "
                       f"of length {len(out) if hasattr(out, '__len__') else '?'}.")
    return list(out)

  return cache_lib.cached_map(fn, prompts, cache, model_id, settings, chunk_size, meta={"kind": kind},
                              on_chunk=_progress_hook(progress, counter))


def _progress_hook(progress, counter):
  def hook(n: int) -> None:
    if counter is not None:
      counter[0] += n
      if progress is not None:
        progress.update(counter[0])
  return hook


# ---------------------------------------------------------------------------------- log-probability judging


def resolve_judge_mode(judge: Judge, judge_mode: str) -> str:
  """'generate' or 'logprob' ('auto': 'logprob' when the judge can score options, else 'generate').

  Args:
    judge: the Judge (it can score options when it has a callable `choice_logprobs`).
    judge_mode: one of JUDGE_MODES ('auto', 'generate', 'logprob').

  Returns:
    'generate' or 'logprob'.

  Raises:
    ValueError: unknown judge_mode, or 'logprob' for a judge without choice_logprobs.
  """
  if judge_mode not in JUDGE_MODES:
    raise ValueError(f"judge_mode must be one of {JUDGE_MODES}, got {judge_mode!r}.")
  can_score = callable(getattr(judge, "choice_logprobs", None))
  if judge_mode == "auto":
    return "logprob" if can_score else "generate"
  if judge_mode == "logprob" and not can_score:
    raise ValueError(f"judge_mode='logprob' needs a judge with choice_logprobs(prompts, options); "
                     f"{type(judge).__name__} has none (use judge_mode='generate').")
  return judge_mode


_SEP = "\x00<answer-prefix>\x00"


def call_choice(judge: Judge, prompts: Sequence[str], options: Sequence[str],
                cache: cache_lib.GenerationCache | None = None, model_id: str | None = None, chunk_size: int = 64,
                answer_prefixes: Sequence[str] | None = None, progress: metrics_lib.Progress | None = None,
                counter: list | None = None) -> np.ndarray:
  """`judge.choice_logprobs` over prompts with caching and resumability (see `call_judge`).

  Args:
    judge: has `choice_logprobs(prompts, options, answer_prefixes=None) -> [P, O]`.
    prompts: P ChatML prompts.
    options: O answer strings (the same for every prompt).
    cache, model_id, chunk_size, progress, counter: as in `call_judge`.
    answer_prefixes: optional P texts already in the assistant's turn (e.g. a CoT explanation).

  Returns:
    [P, O] float64 log-probabilities.
  """
  if isinstance(prompts, str):
    raise TypeError("call_choice takes a list of prompts, got one str; wrap it in a list.")
  prompts, options = list(prompts), list(options)
  if answer_prefixes is not None and len(answer_prefixes) != len(prompts):
    raise ValueError(f"{len(answer_prefixes)} answer_prefixes for {len(prompts)} prompts.")
  if not prompts:
    return np.zeros((0, len(options)))
  model_id = model_id or getattr(judge, "model_id", None)
  fn_settings = getattr(judge, "scoring_settings", None)
  settings = {"mode": "logprob", "options": options, **(dict(fn_settings()) if callable(fn_settings) else {})}
  texts = prompts if answer_prefixes is None else [p + _SEP + a for p, a in zip(prompts, answer_prefixes)]

  def fn(chunk: list[str]):
    if answer_prefixes is None:
      out = judge.choice_logprobs(chunk, options)
    else:
      parts = [t.split(_SEP, 1) for t in chunk]
      out = judge.choice_logprobs([p for p, _ in parts], options, answer_prefixes=[a for _, a in parts])
    out = np.asarray(out, np.float64)
    if out.shape != (len(chunk), len(options)) or not np.all(np.isfinite(out)):
      raise ValueError(f"choice_logprobs must return finite [{len(chunk)}, {len(options)}] values, got shape "
                       f"{out.shape}.")
    return list(out)

  vals = cache_lib.cached_map(fn, texts, cache, model_id, settings, chunk_size, meta={"kind": "choice"},
                              on_chunk=_progress_hook(progress, counter))
  return np.asarray(vals, np.float64).reshape(len(prompts), len(options))


def cot_explanation(completion: str) -> str:
  """The explanation part of a CoT answer: the text before its verdict ("Therefore, ..." or "Output (x) is
  better."), stripped. Log-probability mode scores the two verdicts after it."""
  cut = len(completion)
  for pat in (r"Therefore", *P.COT_PATTERNS.values()):
    m = re.search(pat, completion)
    if m:
      cut = min(cut, m.start())
  return completion[:cut].strip()


def _margins(judge, prompts, answer, call, cache, model_id, chunk_size, progress, counter):
  """[P, 2] log-probabilities of the (a)/(b) verdicts and the CoT completions (None for direct answers)."""
  if answer == "direct":
    return call_choice(judge, prompts, ANSWER_OPTIONS, cache, model_id, chunk_size, None, progress, counter), None
  if answer != "cot":
    raise ValueError(f"no log-probability verdict for answer kind {answer!r}.")
  completions = call(prompts, "cot")
  expl = [cot_explanation(c) for c in completions]
  lp = np.zeros((len(prompts), 2))
  for empty in (True, False):  # after an explanation the verdict starts with a space
    idx = [i for i, e in enumerate(expl) if (e == "") == empty]
    if idx:
      opts = COT_OPTIONS if empty else tuple(" " + o for o in COT_OPTIONS)
      lp[idx] = call_choice(judge, [prompts[i] for i in idx], opts, cache, model_id, chunk_size,
                            [expl[i] for i in idx], progress, counter)
  return lp, completions


def _picks(pref: np.ndarray, tau: float, first: int = 1) -> np.ndarray:
  """1/2 by the sign of a preference for `first`'s side, 0 for a tie (|pref| < tau or exactly 0)."""
  second = 3 - first
  tie = (np.abs(pref) < tau) | (pref == 0)
  return np.where(tie, 0, np.where(pref > 0, first, second)).astype(np.int64)


def _judge_by_logprob(judge, instances, s, prompts, call, cache, model_id, chunk_size, progress, counter, records,
                      tau, debiased_ties: str = "raw") -> dict:
  from iclr24_jax import lm  # the annotator kit's debiasing (a pure function of the two orders' log-probs)
  n = len(instances)
  labels = np.array([inst.label for inst in instances], np.int64)
  if s.kind == "rating":
    lp = call_choice(judge, prompts, RATING_OPTIONS, cache, model_id, chunk_size, None, progress, counter)
    probs = np.exp(lp - np.logaddexp.reduce(lp, axis=1, keepdims=True))  # renormalised over the 10 digits
    expected = probs @ np.arange(10.0)
    e1, e2 = expected[:n], expected[n:]
    pref = e1 - e2  # Deviation: the expected score replaces the parsed integer; no positions, so no debiasing
    w = _picks(pref, tau)
    for i in range(n):
      records[i].update(expected_scores=[float(e1[i]), float(e2[i])], winners=[int(w[i])] * 2,
                        preference=float(pref[i]))
    return {"strategy": s.name, "judge_mode": "logprob", "labels": labels, "winners_original": w,
            "winners_swapped": w.copy(), "raw_original": w.copy(), "raw_swapped": w.copy(), "preference": pref,
            "debiased_ties": int(np.sum(w == 0)), "margins": np.stack([e1, e2], 1), "mean_position_bias": 0.0}
  lp, completions = _margins(judge, prompts, s.answer, call, cache, model_id, chunk_size, progress, counter)
  lp_orig, lp_swap = lp[:n].copy(), lp[n:].copy()
  if s.kind == "swap":
    # Swap-and-synthesize: where the raw per-order picks conflict, the synthesis prompts (both orders) see both
    # explanations and their verdict log-probabilities replace the stage-1 ones.
    r0 = _picks(lp_orig[:, 0] - lp_orig[:, 1], tau, 1)
    r1 = _picks(lp_swap[:, 0] - lp_swap[:, 1], tau, 2)
    conflict = [i for i in range(n) if {int(r0[i]), int(r1[i])} == {1, 2}]
    if conflict:
      aux = {i: {"completions": (completions[i], completions[n + i]), "winners": (int(r0[i]), int(r1[i]))}
             for i in conflict}
      sp = [build_prompt(s, instances[i], o, aux[i], stage="synthesize") for o in (0, 1) for i in conflict]
      progress.total += len(sp)
      slp, scompl = _margins(judge, sp, s.synth_answer, call, cache, model_id, chunk_size, progress, counter)
      m = len(conflict)
      for j, i in enumerate(conflict):
        records[i]["stage1_margins"] = [float(lp_orig[i, 0] - lp_orig[i, 1]), float(lp_swap[i, 0] - lp_swap[i, 1])]
        if scompl is not None:
          records[i]["synthesis"] = [scompl[j], scompl[m + j]]
        lp_orig[i], lp_swap[i] = slp[j], slp[m + j]
  m0, m1 = lp_orig[:, 0] - lp_orig[:, 1], lp_swap[:, 0] - lp_swap[:, 1]
  pref = np.asarray(lm.debiased_preference(lp_orig, lp_swap), np.float64)  # (m0 - m1) / 2
  w = _picks(pref, tau)
  r0, r1 = _picks(m0, tau, 1), _picks(m1, tau, 2)  # raw picks; swapped order mapped back
  w_orig, w_swap = w.copy(), w.copy()
  if debiased_ties == "raw":
    # A debiased tie carries no preference of its own: fall back to the per-order picks, which the official
    # protocol would have scored (a positional judgement is right in exactly one order: 0.5, no agreement).
    tie = w == 0
    w_orig[tie], w_swap[tie] = r0[tie], r1[tie]
  for i in range(n):
    records[i].update(margins=[float(m0[i]), float(m1[i])], preference=float(pref[i]),
                      winners=[int(w_orig[i]), int(w_swap[i])], raw_winners=[int(r0[i]), int(r1[i])])
    if completions is not None:
      records[i]["completions"] = [completions[i], completions[n + i]]
  return {"strategy": s.name, "judge_mode": "logprob", "labels": labels, "winners_original": w_orig,
          "winners_swapped": w_swap, "raw_original": r0, "raw_swapped": r1, "preference": pref,
          "debiased_ties": int(np.sum(w == 0)), "margins": np.stack([m0, m1], 1),
          "mean_position_bias": float(np.mean((m0 + m1) / 2))}


def _winners_from_ratings(s1: int | None, s2: int | None, ties: str) -> tuple[int, int]:
  if s1 is not None and s2 is not None and s1 != s2:
    w = 1 if s1 > s2 else 2
    return w, w
  if ties == "zero":
    return 0, 0
  # ties == 'official': the official script's quirk. A tie gives (2, 1) ("1" if s1 > s2 else "2" and
  # "2" if s2 > s1 else "1"), a parse failure (1, 2): either way one order is right, and the orders disagree.
  # official: princeton-nlp/LLMBar@900616b LLMEvaluator/evaluate.py:444-458
  return (2, 1) if (s1 is not None and s2 is not None) else (1, 2)


def evaluate(judge: Judge, instances: Sequence[Instance], strategy: str | Strategy,
             max_new_tokens: Mapping[str, int] | None = None, cache: cache_lib.GenerationCache | None = None,
             model_id: str | None = None, rating_ties: str = "zero", rating_strict: bool = True,
             count_failures_as_agreement: bool = False, chunk_size: int = 64, verbose: bool = False,
             judge_mode: str = "auto", tie_tau: float = DEFAULT_TIE_TAU, debiased_ties: str = "raw") -> dict:
  """Runs an evaluator (judge + strategy) on instances in both orders and scores it.

  Two judge modes. 'generate' (the paper's protocol): the judge writes its answer and the official regexes
  parse it. 'logprob' (ours): the judge still generates what a strategy needs first (metrics,
  reference, a CoT explanation), but its verdict is read from log-probabilities: in each order the margin
  m_o = log p("Output (a)") - log p("Output (b)") after the prompt (`lm.choice_logprobs`, one prefill per
  prompt; CoT: the explanation then "Therefore, Output (x) is better."; rating: the expected score over the
  digits 0-9). The judgement of a pair is the order-averaged log-odds for output_1, `lm.debiased_preference`
  = (m_original - m_swapped) / 2, so a purely positional judge gets 0. Its sign is the pick in both orders; on a
  tie (|preference| < tie_tau) the pair falls back to its raw per-order picks (sign of m_o), as the official
  protocol would score those answers: a positional judgement is right in one order (credit 0.5) and disagrees.
  The raw per-order picks also give 'raw_accuracy', 'raw_agreement' and 'position_a_rate'.

  Args:
    judge: `judge(prompts: list[str], max_new_tokens) -> list[str]`; see `model.py`. For 'logprob' it also
      has `choice_logprobs(prompts, options, answer_prefixes=None) -> [P, O]`.
    instances: N LLMBar instances.
    strategy: a name in STRATEGIES.
    max_new_tokens: per call kind ('metrics', 'reference', 'direct', 'cot', 'rating'); missing kinds use the
      official budgets (50, 150, 384, 300, 50).
    cache: optional GenerationCache (resumable runs).
    model_id: cache-key name of the judge (default `judge.model_id`).
    rating_ties: 'zero' (a tie or unparsable score is a failure, 0, in both orders: wrong and disagreeing) or
      'official' (the official script's quirk: a tie counts as (2, 1), a failure as (1, 2), i.e. half right).
    rating_strict: parse scores as the official `int(text)` (True) or take the first integer (False).
    count_failures_as_agreement: see `scoring.score`.
    chunk_size: prompts per judge call (and per cache write).
    verbose: print progress to stderr.
    judge_mode: 'generate', 'logprob', or 'auto' (= 'logprob' when the judge has `choice_logprobs`).
    tie_tau: logprob mode: |preference| below this (nats; expected-score points for rating) is a tie.
    debiased_ties: logprob mode, pairwise strategies: 'raw' (a tie falls back to the raw per-order picks, the
      official scoring of those answers) or 'zero' (a tie is a failure, 0, in both orders: wrong, disagreeing).

  Returns:
    {'strategy', 'judge_mode', 'labels' [N], 'winners_original' [N], 'winners_swapped' [N] (mapped back;
    0 = failure/tie), 'raw_original' / 'raw_swapped' [N] (logprob mode: the per-order picks before
    debiasing; generate mode: the winners), 'accuracy', 'agreement', ... (see `scoring.score`), 'raw_accuracy',
    'raw_agreement', 'position_a_rate' (share of the raw judgements picking the output shown as (a)),
    logprob mode: 'preference' [N], 'margins' [N, 2] (m_original, m_swapped), 'mean_position_bias' (nats),
    'debiased_ties' (pairs whose debiased preference is a tie);
    'records': per-instance dicts (uid, subset, label, aux texts, completions, winners, margins),
    'num_generations' (judge calls' prompts, generated or scored), 'seconds'}.
  """
  s = get_strategy(strategy)
  judge_mode = resolve_judge_mode(judge, judge_mode)
  if rating_ties not in ("zero", "official"):
    raise ValueError(f"rating_ties must be 'zero' or 'official', got {rating_ties!r}.")
  if debiased_ties not in ("raw", "zero"):
    raise ValueError(f"debiased_ties must be 'raw' or 'zero', got {debiased_ties!r}.")
  instances = list(instances)
  if not instances:
    raise ValueError("evaluate needs at least one instance.")
  for inst in instances:
    _check_instance(inst)
  budget = dict(OFFICIAL_MAX_NEW_TOKENS)
  budget.update(dict(max_new_tokens or {}))
  n = len(instances)
  t0 = time.perf_counter()
  total = n * (len(s.aux) + 2)
  progress = metrics_lib.Progress(total, name=f"llmbar/{s.name}", stream=sys.stderr, enabled=verbose)
  counter = [0]
  call = lambda prompts, kind: call_judge(judge, prompts, budget[kind], kind, cache, model_id, chunk_size,
                                          progress, counter)
  records = [{"uid": inst.uid, "subset": inst.subset, "label": inst.label, "aux": {}} for inst in instances]

  # 1. Auxiliary generations (metrics questions, reference output), stripped as in the official harness.
  aux_texts = [dict() for _ in instances]
  for aux_kind in s.aux:
    outs = call([build_aux_prompt(aux_kind, inst) for inst in instances], aux_kind)
    for i, text in enumerate(outs):
      aux_texts[i][aux_kind] = text.strip()
      records[i]["aux"][aux_kind] = text.strip()

  # 2. Judging in both orders (rating: one prompt per output).
  prompts = [build_prompt(s, inst, o, aux_texts[i]) for o in (0, 1) for i, inst in enumerate(instances)]
  if judge_mode == "logprob":
    result = _judge_by_logprob(judge, instances, s, prompts, call, cache, model_id, chunk_size, progress, counter,
                               records, tie_tau, debiased_ties)
    progress.update(counter[0], force=True)
    result.update(scoring.score(result["labels"], result["winners_original"], result["winners_swapped"],
                                count_failures_as_agreement))
    raw = scoring.score(result["labels"], result["raw_original"], result["raw_swapped"], count_failures_as_agreement)
    result.update(raw_accuracy=raw["accuracy"], raw_agreement=raw["agreement"],
                  position_a_rate=scoring.first_position_rate(result["raw_original"], result["raw_swapped"]),
                  records=records, num_generations=counter[0], seconds=time.perf_counter() - t0)
    return result
  outs = call(prompts, s.answer)
  first, second = outs[:n], outs[n:]
  w_orig = np.zeros(n, np.int64)
  w_swap = np.zeros(n, np.int64)
  if s.kind == "rating":
    for i in range(n):
      s1, s2 = parsing.parse_rating(first[i], rating_strict), parsing.parse_rating(second[i], rating_strict)
      w_orig[i], w_swap[i] = _winners_from_ratings(s1, s2, rating_ties)
      records[i].update(completions=[first[i], second[i]], scores=[s1, s2])
  else:
    for i in range(n):
      w_orig[i] = parsing.map_back(parsing.parse_answer(first[i], s.answer), 0)
      w_swap[i] = parsing.map_back(parsing.parse_answer(second[i], s.answer), 1)
      records[i].update(completions=[first[i], second[i]])

  # 3. Swap-and-synthesize: where the two orders pick different outputs, a synthesis prompt (both orders)
  #    sees both explanations, relabelled to the order it shows, and its answers replace the stage-1 ones.
  if s.kind == "swap":
    conflict = [i for i in range(n) if {int(w_orig[i]), int(w_swap[i])} == {1, 2}]
    if conflict:
      synth_aux = {i: {"completions": (first[i], second[i]), "winners": (int(w_orig[i]), int(w_swap[i]))}
                   for i in conflict}
      sp = [build_prompt(s, instances[i], o, synth_aux[i], stage="synthesize") for o in (0, 1) for i in conflict]
      progress.total += len(sp)
      souts = call(sp, s.synth_answer)
      m = len(conflict)
      for j, i in enumerate(conflict):
        records[i]["stage1_winners"] = [int(w_orig[i]), int(w_swap[i])]
        records[i]["synthesis"] = [souts[j], souts[m + j]]
        w_orig[i] = parsing.map_back(parsing.parse_answer(souts[j], s.synth_answer), 0)
        w_swap[i] = parsing.map_back(parsing.parse_answer(souts[m + j], s.synth_answer), 1)
  progress.update(counter[0], force=True)

  labels = np.array([inst.label for inst in instances], np.int64)
  for i in range(n):
    records[i]["winners"] = [int(w_orig[i]), int(w_swap[i])]
  result = {"strategy": s.name, "judge_mode": "generate", "labels": labels, "winners_original": w_orig,
            "winners_swapped": w_swap, "raw_original": w_orig, "raw_swapped": w_swap}
  result.update(scoring.score(labels, w_orig, w_swap, count_failures_as_agreement))
  result.update(raw_accuracy=result["accuracy"], raw_agreement=result["agreement"])
  # Positional bias: share of the 2N judgements that picked the output shown as (a) (original pick 1, or a
  # swapped pick mapped back to 2). 1.0 = the always-"(a)" judge.
  result["position_a_rate"] = scoring.first_position_rate(w_orig, w_swap)
  result.update(records=records, num_generations=counter[0], seconds=time.perf_counter() - t0)
  return result


def evaluate_subsets(judge: Judge, data: Mapping[str, Sequence[Instance]], strategy: str | Strategy,
                     n_boot: int = 2000, boot_seed: int = 0, **kwargs) -> dict:
  """`evaluate` on every subset at once (one pass, so batches mix subsets) and per-subset scores.

  Args:
    judge: the judge.
    data: {subset: instances}.
    strategy: the strategy.
    n_boot, boot_seed: bootstrap resamples and seed of the accuracy intervals.
    **kwargs: passed to `evaluate`.

  Returns:
    {'all': evaluate(...) over everything, 'subsets': scoring.subset_report(...) incl. 'Adversarial' (score,
    bootstrap 95% interval 'ci', raw picks' accuracy/agreement, first-position rate)}.
  """
  names = list(data)
  flat = [inst for name in names for inst in data[name]]
  res = evaluate(judge, flat, strategy, **kwargs)
  per, start = {}, 0
  for name in names:
    k = len(data[name])
    per[name] = {f: res[f][start:start + k] for f in ("labels", "winners_original", "winners_swapped",
                                                       "raw_original", "raw_swapped")}
    start += k
  cfa = kwargs.get("count_failures_as_agreement", False)
  report = scoring.subset_report({k: v for k, v in per.items() if len(v["labels"])}, cfa, n_boot=n_boot,
                                 seed=boot_seed)
  return {"all": res, "subsets": report}
