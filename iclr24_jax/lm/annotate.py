"""The annotator kit: a local LM as judge or annotator, read by log-probabilities (default) or by its text.

A judge answers ChatML prompts (`<|im_start|>system ...<|im_end|><|im_start|>user ...<|im_end|>`, the format
the LLM-as-judge papers publish). Two ways to read it:

- **log-probabilities over the options** (`judge.choice_logprobs(prompts, options) -> [P, O]`, built on
  `lm.choice_logprobs`: one prefill per prompt, its KV cache reused for every option). With both presentation
  orders, `lm.debiased_preference` cancels the positional bias. This is the default for every LM-as-annotator
  in the library: a 135M judge's greedy text is constant (LLMBar measured "Output (a)" in 100% of answers),
  while its log-odds still move with the content.
- **generated text** (`judge(prompts, max_new_tokens, kind=...) -> list[str]`), parsed by the caller: greedy,
  batched, KV cache, optional per-kind logit bias.

`SmolLMJudge` runs SmolLM2-135M-Instruct (or any `lm` Llama); `FakeJudge` and `ConstantJudge` are deterministic
stand-ins for tests (a hash of seed + prompt [+ option], plus an optional known preference).

  judge = lm.SmolLMJudge()
  lp_ab = judge.choice_logprobs(prompts_ab, ["Output (a)", "Output (b)"])   # [N, 2]
  lp_ba = judge.choice_logprobs(prompts_ba, ["Output (a)", "Output (b)"])
  pref = lm.debiased_preference(lp_ab, lp_ba)                             # [N] > 0: the first item wins
"""
from __future__ import annotations

import functools
import hashlib
import math
import re
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from iclr24_jax.lm import generation, llama, scoring, weights
from iclr24_jax.lm import tokenizer as tok_lib

SMOLLM2_ID = "SmolLM2-135M-Instruct/Q4_1-gguf/float32"
DEFAULT_WIDTHS = (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

_TURN = re.compile(r"<\|im_start\|>(.*?)(?:<\|im_end\|>|$)", re.S)


def chatml_to_messages(prompt: str) -> list[dict[str, str]]:
  """Splits a ChatML prompt into chat messages.

  Each `<|im_start|>ROLE\\nCONTENT<|im_end|>` turn becomes {'role': ROLE, 'content': CONTENT.strip()} (as the
  LLM-as-judge harnesses strip contents before calling a chat API). Text without ChatML markers is one user
  message.

  Args:
    prompt: ChatML text.

  Returns:
    [{'role', 'content'}, ...].
  """
  if not isinstance(prompt, str):
    raise TypeError(f"chatml_to_messages expects a str, got {type(prompt).__name__}.")
  if "<|im_start|>" not in prompt:
    return [{"role": "user", "content": prompt.strip()}]
  messages = []
  for turn in _TURN.findall(prompt.strip()):
    head, _, body = turn.partition("\n")
    role = head.strip()
    if not role:
      raise ValueError(f"ChatML turn without a role: {turn[:60]!r}.")
    messages.append({"role": role, "content": body.strip()})
  return messages


def _width(n: int, widths: Sequence[int]) -> int:
  for w in widths:
    if w >= n:
      return int(w)
  raise ValueError(f"a prompt of {n} tokens is longer than the largest width {widths[-1]}; raise the widths.")


def _rows(n: int, batch_size: int) -> int:
  """Rows of a compiled call: the batch size, or the next power of two for a short last batch (a batch-8
  program on 2 real rows would spend 4x the compute; a small extra compile is cheaper)."""
  rows = 1
  while rows < n:
    rows *= 2
  return min(rows, batch_size) if n <= batch_size else batch_size


def _check_prompts(prompts) -> list[str]:
  if isinstance(prompts, str):
    raise TypeError("a judge takes a list of prompts, got one str; wrap it in a list.")
  return list(prompts)


class SmolLMJudge:
  """A local LM as a judge: SmolLM2-135M-Instruct by default (greedy decoding or option log-probabilities).

  Prompts are ChatML text; they are split into messages and rendered with the model's own chat template
  (SmolLM2: ChatML with its default system prompt only where the prompt has no system turn), then left-padded
  to a width from `widths` so a run compiles a handful of programs. Prompts of one call are sorted by length
  before batching and answers come back in the caller's order.

  Args:
    params, config, tokenizer: an `iclr24_jax.lm` Llama (default: `lm.load_smollm2()`).
    batch_size: rows per compiled call.
    logit_bias: {kind: {token id: additive bias} or None} applied when generating for that kind (None: none).
    widths: allowed padded prompt lengths (tokens); the largest is the longest prompt accepted.
    model_id: the name used in cache keys.
    stop_ids: tokens that end an answer (default: the tokenizer's EOS; () generates exactly max_new_tokens).
  """

  accepts_kind = True

  def __init__(self, params=None, config=None, tokenizer=None, batch_size: int = 8,
               logit_bias: Mapping[str, Mapping[int, float] | None] | None = None,
               widths: Sequence[int] = DEFAULT_WIDTHS, model_id: str = SMOLLM2_ID,
               stop_ids: Sequence[int] | None = None):
    if params is None:
      params, config, tokenizer = weights.load_smollm2()
    if config is None or tokenizer is None:
      raise ValueError("pass params, config and tokenizer together (or none of them to load SmolLM2).")
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    self.params = llama.fuse_params(params)
    self.config = config
    self.tokenizer = tokenizer
    self.batch_size = int(batch_size)
    self.widths = tuple(sorted(int(w) for w in widths))
    self.model_id = model_id
    if stop_ids is None:
      stop_ids = (tokenizer.eos_id,) if tokenizer.eos_id is not None else ()
    self.stop_ids = tuple(int(i) for i in stop_ids)
    self._bias = {k: (dict(v) if v else None) for k, v in dict(logit_bias or {}).items()}
    self._compiled: dict[tuple, Callable] = {}
    self.num_calls = 0
    self.num_prompt_tokens = 0
    self.num_padded_tokens = 0

  def render(self, prompt: str) -> str:
    """The exact text the model reads for one ChatML prompt (chat template + assistant header)."""
    return self.tokenizer.apply_chat_template(chatml_to_messages(prompt), add_generation_prompt=True)

  def bias_for(self, kind: str) -> dict[int, float] | None:
    """The logit bias used when generating for `kind` (None: none)."""
    return self._bias.get(kind)

  def decoding_settings(self, kind: str) -> dict:
    """What, besides the prompt and max_new_tokens, decides a generation (enters the cache key)."""
    bias = self.bias_for(kind)
    return {"temperature": 0.0, "template": "chatml", "stop_ids": list(self.stop_ids),
            "logit_bias": sorted(bias.items()) if bias else None}

  def scoring_settings(self) -> dict:
    """What, besides the prompt and the options, decides `choice_logprobs` (enters the cache key)."""
    return {"template": "chatml", "scoring": "choice_logprobs/v1"}

  def _fn(self, max_new_tokens: int, with_bias: bool) -> Callable:
    key = (max_new_tokens, with_bias)
    if key not in self._compiled:
      gen = functools.partial(generation.generate, config=self.config, max_new_tokens=max_new_tokens,
                              temperature=0.0, stop_ids=self.stop_ids, pad_id=self.tokenizer.pad_id)
      self._compiled[key] = jax.jit(lambda params, ids, mask, key, bias: gen(
          params, prompt_ids=ids, prompt_mask=mask, key=key, logit_bias=bias))
    return self._compiled[key]

  def generate_ids(self, encoded: Sequence[Sequence[int]], max_new_tokens: int,
                   bias: Mapping[int, float] | None = None, batch_size: int | None = None) -> list[list[int]]:
    """Greedy continuations of token-id prompts, in input order.

    Args:
      encoded: prompts as id lists.
      max_new_tokens: most new tokens per prompt.
      bias: {token id: additive logit bias} or None.
      batch_size: rows per call (default: the judge's).

    Returns:
      One list of generated ids per prompt (the stop token excluded).
    """
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    bsz = int(batch_size or self.batch_size)
    fn = self._fn(int(max_new_tokens), bias is not None)
    bias_vec = generation.bias_vector(bias, self.config.vocab_size)
    order = np.argsort([len(e) for e in encoded], kind="stable")
    results: list[list[int] | None] = [None] * len(encoded)
    for start in range(0, len(order), bsz):
      idx = order[start:start + bsz]
      rows = [list(encoded[i]) for i in idx]
      width = _width(max(len(r) for r in rows), self.widths)
      if width + max_new_tokens > self.config.max_seq_len:
        raise ValueError(f"prompt width {width} + {max_new_tokens} new tokens exceeds the model's context "
                         f"{self.config.max_seq_len}.")
      rows = rows + [rows[0]] * (_rows(len(rows), bsz) - len(rows))  # dummy rows: few compiled batch shapes
      ids, mask = tok_lib.pad_sequences(rows, self.tokenizer.pad_id, max_len=width, padding="left")
      out = fn(self.params, ids, mask, jax.random.key(0), bias_vec)
      tokens, lengths, stopped = jax.device_get((out.tokens, out.lengths, out.stopped))
      self.num_calls += 1
      self.num_prompt_tokens += sum(len(encoded[i]) for i in idx)
      self.num_padded_tokens += len(rows) * width
      for j, i in enumerate(idx):
        n = int(lengths[j]) - int(bool(stopped[j]))
        results[i] = [int(t) for t in tokens[j, :n]]
    return results  # type: ignore[return-value]

  def __call__(self, prompts: Sequence[str], max_new_tokens: int, kind: str = "free",
               batch_size: int | None = None) -> list[str]:
    """Answers ChatML prompts with greedy text.

    Args:
      prompts: ChatML prompts.
      max_new_tokens: most new tokens per answer.
      kind: what the call is for (picks the logit bias; any string).
      batch_size: rows per call (default: the judge's).

    Returns:
      One stripped answer per prompt.
    """
    prompts = _check_prompts(prompts)
    encoded = [self.tokenizer.encode(self.render(p)) for p in prompts]
    ids = self.generate_ids(encoded, max_new_tokens, self.bias_for(kind), batch_size)
    return [self.tokenizer.decode(x).strip() for x in ids]

  def choice_logprobs(self, prompts: Sequence[str], options: Sequence[str], batch_size: int | None = None,
                      answer_prefixes: Sequence[str] | None = None) -> np.ndarray:
    """log p(option | rendered prompt) for every prompt and option (`lm.choice_logprobs`; no logit bias).

    Args:
      prompts: P ChatML prompts (rendered with the chat template, so options start the assistant's answer).
      options: O answer strings, e.g. ["Output (a)", "Output (b)"].
      batch_size: prompts per compiled call (default: the judge's).
      answer_prefixes: optional P strings already written in the assistant's turn before the option (e.g. a
        generated explanation); the options are scored after them.

    Returns:
      [P, O] float64 summed log-probabilities.
    """
    prompts = _check_prompts(prompts)
    rendered = [self.render(p) for p in prompts]
    if answer_prefixes is not None:
      answer_prefixes = _check_prompts(answer_prefixes)
      if len(answer_prefixes) != len(prompts):
        raise ValueError(f"{len(answer_prefixes)} answer_prefixes for {len(prompts)} prompts.")
      rendered = [r + a for r, a in zip(rendered, answer_prefixes)]
    # A finer width ladder than generation's (128-token steps): scoring is prefill-bound, padding is the waste.
    widths = tuple(w for w in scoring.CHOICE_WIDTHS if w <= max(self.widths)) or self.widths
    out = scoring.choice_logprobs(self.params, self.config, self.tokenizer, rendered, options,
                                  batch_size=int(batch_size or self.batch_size), widths=widths)
    self.num_calls += math.ceil(len(prompts) / int(batch_size or self.batch_size))
    return out

  def answer_margins(self, prompts: Sequence[str], prefix: str = "Output (", first: str = "a)",
                     second: str = "b)", batch_size: int | None = None) -> np.ndarray:
    """log p(prefix + first) - log p(prefix + second) as the start of the answer.

    Equal to the difference of the two columns of `choice_logprobs(prompts, [prefix + first, prefix +
    second])` (the shared prefix tokens cancel); the greedy argmax turns it into a hard answer.

    Args:
      prompts: ChatML prompts.
      prefix, first, second: the two answers are prefix + first and prefix + second.
      batch_size: rows per call.

    Returns:
      [N] float margins (> 0: prefers the first answer).
    """
    lp = self.choice_logprobs(prompts, [prefix + first, prefix + second], batch_size)
    return lp[:, 0] - lp[:, 1]


# ------------------------------------------------------------------------------------------- test stand-ins


def stable_hash(*parts: object) -> int:
  """A 64-bit integer hash of the parts joined by NUL (stable across runs and machines)."""
  text = "\x00".join(str(p) for p in parts)
  return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def _hash_normal(*parts: object) -> float:
  """A deterministic standard normal draw from a hash (Box-Muller on two 32-bit halves)."""
  h = stable_hash(*parts)
  u1 = ((h & 0xFFFFFFFF) + 0.5) / 2 ** 32
  u2 = ((h >> 32) + 0.5) / 2 ** 32
  return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


class FakeJudge:
  """A deterministic judge for tests: answers and option scores are hashes of (seed, prompt[, option]).

  `choice_logprobs` returns log-softmax over the options of `preference(prompt, option) + noise * z`, with z a
  hash-seeded standard normal per (seed, prompt, option): `preference=None, noise=1` is a chance-level judge,
  `noise=0` with a preference is an exact one (e.g. +3 for whichever option says "(a)": the purely positional
  judge). Text answers are `choices[hash % len(choices)]` (or a hashed stub text).

  Args:
    seed: changes every answer and score.
    model_id: name used in cache keys.
    choices: the answers `__call__` picks from (default: a stub text per prompt).
    preference: optional (prompt, option) -> float, a known preference added to the scores.
    noise: scale of the hashed noise in the scores.
  """

  accepts_kind = True

  def __init__(self, seed: int = 0, model_id: str | None = None, choices: Sequence[str] | None = None,
               preference: Callable[[str, str], float] | None = None, noise: float = 1.0):
    self.seed = int(seed)
    self.model_id = model_id or f"fake-judge-{seed}"
    self.choices = tuple(choices) if choices else None
    self.preference = preference
    self.noise = float(noise)
    self.calls: list[tuple[str, int, int]] = []  # (kind, number of prompts, max_new_tokens or -1 for scoring)

  def decoding_settings(self, kind: str) -> dict:
    """The cache settings of a generation call of `kind` ({'kind': kind}: answers depend on nothing else)."""
    return {"kind": kind}

  def scoring_settings(self) -> dict:
    """The cache settings of scoring calls: the noise scale and the preference function's name."""
    return {"noise": self.noise, "preference": getattr(self.preference, "__name__", None)}

  def answer(self, prompt: str, kind: str) -> str:
    """The text answer for one prompt (override for a task's formats).

    Args:
      prompt: the prompt text.
      kind: the call kind (unused here; subclasses answer per kind).

    Returns:
      one of `choices` picked by a hash of (seed, prompt), or 'answer <hash % 997>'.
    """
    h = stable_hash(self.seed, prompt)
    if self.choices:
      return self.choices[h % len(self.choices)]
    return f"answer {h % 997}"

  def __call__(self, prompts: Sequence[str], max_new_tokens: int, kind: str = "free") -> list[str]:
    prompts = _check_prompts(prompts)
    self.calls.append((kind, len(prompts), int(max_new_tokens)))
    return [self.answer(p, kind) for p in prompts]

  def choice_logprobs(self, prompts: Sequence[str], options: Sequence[str], batch_size: int | None = None,
                      answer_prefixes: Sequence[str] | None = None) -> np.ndarray:
    """[P, O] log-probabilities (each row log-normalised over the options); an answer prefix is appended to
    its prompt before hashing and before `preference` sees it.

    Args:
      prompts: P prompt strings.
      options: O option strings (at least one).
      batch_size: ignored (the LM judges' signature).
      answer_prefixes: optional P strings appended to the prompts.

    Returns:
      float64 [P, O]: preference(p, o) + noise * hashed N(0, 1), log-softmaxed over the options.

    Raises:
      ValueError: no options, or a prefix count other than P.
    """
    prompts = _check_prompts(prompts)
    if answer_prefixes is not None:
      if len(answer_prefixes) != len(prompts):
        raise ValueError(f"{len(answer_prefixes)} answer_prefixes for {len(prompts)} prompts.")
      prompts = [p + a for p, a in zip(prompts, answer_prefixes)]
    options = list(options)
    if not options:
      raise ValueError("choice_logprobs needs at least one option.")
    self.calls.append(("choice", len(prompts), -1))
    scores = np.array([[(self.preference(p, o) if self.preference else 0.0)
                        + self.noise * _hash_normal(self.seed, p, o) for o in options] for p in prompts],
                      np.float64).reshape(len(prompts), len(options))
    return scores - np.logaddexp.reduce(scores, axis=1, keepdims=True) if len(prompts) else scores


class ConstantJudge:
  """Always gives the same answer (e.g. 'Output (a)': the pure positional-bias judge).

  Text: `answer` for every prompt. Scores: log-probability 0 for the option equal to `answer` and
  `other_logprob` for every other option, whatever the prompt.

  Args:
    answer: the text returned for every prompt.
    other_logprob: the log-probability of the other options.
  """

  def __init__(self, answer: str = "Output (a)", other_logprob: float = -20.0):
    self.answer = answer
    self.other_logprob = float(other_logprob)
    self.model_id = f"constant:{answer}"

  def __call__(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    return [self.answer for _ in _check_prompts(prompts)]

  def choice_logprobs(self, prompts: Sequence[str], options: Sequence[str], batch_size: int | None = None,
                      answer_prefixes: Sequence[str] | None = None) -> np.ndarray:
    """[P, O]: 0 where the option is the constant answer, `other_logprob` elsewhere (prefixes ignored).

    Args:
      prompts: P prompt strings.
      options: O option strings.
      batch_size: ignored.
      answer_prefixes: ignored.

    Returns:
      float64 [P, O] (rows are not normalised).
    """
    row = np.array([0.0 if o == self.answer else self.other_logprob for o in options], np.float64)
    return np.tile(row, (len(_check_prompts(prompts)), 1))
