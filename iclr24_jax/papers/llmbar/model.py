"""Judges: the LLM inside an LLMBar evaluator.

A judge is any callable `judge(prompts: list[str], max_new_tokens: int) -> list[str]` that answers ChatML
prompts (what `build_prompt` returns). A judge that sets `accepts_kind = True` is also told what the call is
for (`kind` in 'metrics', 'reference', 'direct', 'cot', 'rating') and may decode differently per kind; that is
how the logit bias toward "Output (a)"/"Output (b)" reaches direct answers only. A judge may expose `model_id`
and `decoding_settings(kind)`, which enter the generation-cache key.

`SmolLMJudge` runs SmolLM2-135M-Instruct from `iclr24_jax.lm` (greedy = temperature 0, batched, KV cache);
`FakeJudge` and `ConstantJudge` are deterministic stand-ins for tests and the tiny config.
"""
from __future__ import annotations

import functools
import hashlib
import re
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from iclr24_jax import lm
from iclr24_jax.lm import tokenizer as tok_lib
from iclr24_jax.papers.llmbar import prompts as prompts_lib

KINDS = ("metrics", "reference", "direct", "cot", "rating", "free")
SMOLLM2_ID = "SmolLM2-135M-Instruct/Q4_1-gguf/float32"
DEFAULT_WIDTHS = (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

_TURN = re.compile(r"<\|im_start\|>(.*?)(?:<\|im_end\|>|$)", re.S)


def chatml_to_messages(prompt: str) -> list[dict[str, str]]:
  """Splits an official ChatML prompt into chat messages.

  Each `<|im_start|>ROLE\\nCONTENT<|im_end|>` turn becomes {'role': ROLE, 'content': CONTENT.strip()} (the
  official harness strips contents the same way before calling a chat API). Text without ChatML markers is
  one user message.

  Args:
    prompt: ChatML text.

  Returns:
    [{'role', 'content'}, ...].
  """
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


def logit_bias_for(tokenizer: tok_lib.Tokenizer, kind: str, favor: float = prompts_lib.FAVOR_BIAS,
                   avoid: float = prompts_lib.AVOID_BIAS) -> dict[int, float] | None:
  """The official logit bias, mapped onto this tokenizer.

  Direct answers: +`favor` on every token of "Output (a)" and "Output (b)", `avoid` on each word of
  TOKENS_TO_AVOID that is a single token. CoT answers: the avoid part only. Other kinds: None.

  Args:
    tokenizer: the judge's tokenizer.
    kind: call kind.
    favor, avoid: the bias values (official: +7 and -100).

  Returns:
    {token id: bias} or None.
  """
  if kind not in ("direct", "cot"):
    return None
  bias: dict[int, float] = {}
  for word in prompts_lib.TOKENS_TO_AVOID:
    ids = tokenizer.encode(word, add_bos=False)
    if len(ids) == 1:
      bias[ids[0]] = avoid
  if kind == "direct":
    for text in prompts_lib.TOKENS_TO_FAVOR:
      for i in tokenizer.encode(text, add_bos=False):
        bias[i] = favor
  return bias


def _width(n: int, widths: Sequence[int]) -> int:
  for w in widths:
    if w >= n:
      return int(w)
  raise ValueError(f"a prompt of {n} tokens is longer than the largest width {widths[-1]}; raise max_prompt_len.")


def _rows(n: int, batch_size: int) -> int:
  """Rows of a compiled call: the batch size, or the next power of two for a short last batch (a batch-8
  program on 2 real rows would spend 4x the compute; a small extra compile is cheaper)."""
  rows = 1
  while rows < n:
    rows *= 2
  return min(rows, batch_size) if n <= batch_size else batch_size


class SmolLMJudge:
  """SmolLM2-135M-Instruct as an LLMBar judge (greedy decoding, batched, KV cache, per-kind logit bias).

  Prompts are official ChatML text; they are split into messages and rendered with SmolLM2's own chat
  template (also ChatML), then left-padded to a width from `widths` so a run compiles a handful of
  programs. Prompts of one call are sorted by length before batching (less padding) and answers are
  returned in the caller's order.

  Args:
    params, config, tokenizer: an `iclr24_jax.lm` Llama (default: `lm.load_smollm2()`).
    batch_size: rows per compiled call.
    logit_bias: apply the official bias for direct/CoT answers.
    widths: allowed padded prompt lengths (tokens); the largest is the longest prompt accepted.
    model_id: the name used in cache keys.
    stop_ids: tokens that end an answer (default: the tokenizer's EOS; () generates exactly max_new_tokens,
      as a benchmark wants).
  """

  accepts_kind = True

  def __init__(self, params=None, config=None, tokenizer=None, batch_size: int = 8, logit_bias: bool = True,
               widths: Sequence[int] = DEFAULT_WIDTHS, model_id: str = SMOLLM2_ID,
               stop_ids: Sequence[int] | None = None):
    if params is None:
      # Deviation: the paper's judges are GPT-4 / ChatGPT / LLaMA-2 / PaLM 2 / Falcon; the only LM available
      # offline is SmolLM2-135M-Instruct (its Q4_1 GGUF dequantised to float32).
      params, config, tokenizer = lm.load_smollm2()
    if config is None or tokenizer is None:
      raise ValueError("pass params, config and tokenizer together (or none of them to load SmolLM2).")
    self.params = lm.fuse_params(params)
    self.config = config
    self.tokenizer = tokenizer
    self.batch_size = int(batch_size)
    self.use_logit_bias = bool(logit_bias)
    self.widths = tuple(sorted(int(w) for w in widths))
    self.model_id = model_id
    if stop_ids is None:
      stop_ids = (tokenizer.eos_id,) if tokenizer.eos_id is not None else ()
    self.stop_ids = tuple(int(i) for i in stop_ids)
    # Deviation: the official code biases only the OpenAI models' answer tokens; here the same bias is
    # applied to the local judge (option `logit_bias`), as the issue asks.
    self._bias = {k: (logit_bias_for(tokenizer, k) if logit_bias else None) for k in KINDS}
    self._compiled: dict[tuple, Callable] = {}
    self.num_calls = 0
    self.num_prompt_tokens = 0
    self.num_padded_tokens = 0

  def render(self, prompt: str) -> str:
    """The exact text the model reads for one ChatML prompt (chat template + assistant header)."""
    return self.tokenizer.apply_chat_template(chatml_to_messages(prompt), add_generation_prompt=True)

  def decoding_settings(self, kind: str) -> dict:
    """What, besides the prompt and max_new_tokens, decides the output (enters the cache key)."""
    bias = self._bias.get(kind)
    return {"temperature": 0.0, "template": "chatml", "stop_ids": list(self.stop_ids),
            "logit_bias": sorted(bias.items()) if bias else None}

  def _fn(self, max_new_tokens: int, with_bias: bool) -> Callable:
    key = (max_new_tokens, with_bias)
    if key not in self._compiled:
      gen = functools.partial(lm.generate, config=self.config, max_new_tokens=max_new_tokens, temperature=0.0,
                              stop_ids=self.stop_ids, pad_id=self.tokenizer.pad_id)
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
    bias_vec = lm.bias_vector(bias, self.config.vocab_size)
    order = np.argsort([len(e) for e in encoded], kind="stable")
    results: list[list[int] | None] = [None] * len(encoded)
    for start in range(0, len(order), bsz):
      idx = order[start:start + bsz]
      rows = [list(encoded[i]) for i in idx]
      longest = max(len(r) for r in rows)
      width = _width(longest, self.widths)
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

  def answer_margins(self, prompts: Sequence[str], prefix: str = "Output (",
                     batch_size: int | None = None) -> np.ndarray:
    """log p('a') - log p('b') for the token after the judge starts its answer with `prefix`.

    A diagnostic of ours, not the paper's metric: one forward pass per prompt (no sampling) tells how strongly
    the judge leans to the output shown as (a), before the greedy argmax turns it into a hard answer. The logit
    bias (equal for 'a' and 'b') does not change the difference.

    Args:
      prompts: ChatML direct-answer prompts.
      prefix: the forced start of the answer ("Output (" as greedy decoding with the bias produces it).
      batch_size: rows per call.

    Returns:
      [N] float margins (> 0: prefers Output (a)).
    """
    ids_a = self.tokenizer.encode(prefix + "a)")
    ids_b = self.tokenizer.encode(prefix + "b)")
    diff = [i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y]
    if len(ids_a) != len(ids_b) or len(diff) != 1:
      raise ValueError(f"'{prefix}a)' and '{prefix}b)' must differ in exactly one token for this tokenizer.")
    tok_a, tok_b = ids_a[diff[0]], ids_b[diff[0]]
    prefix_ids = ids_a[:diff[0]]
    if "margins" not in self._compiled:
      self._compiled["margins"] = jax.jit(lambda p, i, m: lm.next_token_logprobs(p, self.config, i, m))
    fn = self._compiled["margins"]
    encoded = [self.tokenizer.encode(self.render(p)) + prefix_ids for p in prompts]
    bsz = int(batch_size or self.batch_size)
    order = np.argsort([len(e) for e in encoded], kind="stable")
    out = np.zeros(len(encoded), np.float64)
    for start in range(0, len(order), bsz):
      idx = order[start:start + bsz]
      rows = [encoded[i] for i in idx]
      width = _width(max(len(r) for r in rows), self.widths)
      rows = rows + [rows[0]] * (_rows(len(rows), bsz) - len(rows))
      ids, mask = tok_lib.pad_sequences(rows, self.tokenizer.pad_id, max_len=width, padding="left")
      logp = np.asarray(jax.device_get(fn(self.params, ids, mask)))
      for j, i in enumerate(idx):
        out[i] = float(logp[j, tok_a] - logp[j, tok_b])
    return out

  def __call__(self, prompts: Sequence[str], max_new_tokens: int, kind: str = "free",
               batch_size: int | None = None) -> list[str]:
    """Answers ChatML prompts.

    Args:
      prompts: official-format prompts.
      max_new_tokens: most new tokens per answer.
      kind: what the call is for ('metrics', 'reference', 'direct', 'cot', 'rating', 'free'); picks the bias.
      batch_size: rows per call (default: the judge's).

    Returns:
      One stripped answer per prompt.
    """
    if isinstance(prompts, str):
      raise TypeError("a judge takes a list of prompts, got one str; wrap it in a list.")
    if kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    encoded = [self.tokenizer.encode(self.render(p)) for p in prompts]
    ids = self.generate_ids(encoded, max_new_tokens, self._bias.get(kind), batch_size)
    return [self.tokenizer.decode(x).strip() for x in ids]


def _digest(seed: int, text: str) -> int:
  return int.from_bytes(hashlib.sha256(f"{seed}\x00{text}".encode()).digest()[:8], "little")


class FakeJudge:
  """A deterministic pseudo-random judge (a hash of seed + prompt): a chance-level stand-in with the right
  answer formats, for tests and the tiny config.

  Args:
    seed: changes every answer.
    model_id: name used in cache keys.
  """

  accepts_kind = True

  def __init__(self, seed: int = 0, model_id: str | None = None):
    self.seed = int(seed)
    self.model_id = model_id or f"fake-judge-{seed}"
    self.calls: list[tuple[str, int, int]] = []  # (kind, number of prompts, max_new_tokens)

  def decoding_settings(self, kind: str) -> dict:
    return {"kind": kind}

  def answer(self, prompt: str, kind: str) -> str:
    h = _digest(self.seed, prompt)
    ab = "a" if h % 2 == 0 else "b"
    if kind == "metrics":
      return "1. Does the output do exactly what the instruction asks?\n2. Is it accurate?"
    if kind == "reference":
      return f"A concise reference answer ({h % 97})."
    if kind == "cot":
      return f"Output ({ab}) follows the instruction more closely. Therefore, Output ({ab}) is better."
    if kind == "rating":
      return str(h % 10)
    return f"Output ({ab})"

  def __call__(self, prompts: Sequence[str], max_new_tokens: int, kind: str = "direct") -> list[str]:
    if isinstance(prompts, str):
      raise TypeError("a judge takes a list of prompts, got one str; wrap it in a list.")
    self.calls.append((kind, len(prompts), int(max_new_tokens)))
    return [self.answer(p, kind) for p in prompts]


class ConstantJudge:
  """Always gives the same answer (e.g. 'Output (a)': the pure positional-bias judge). A plain judge: it does
  not take `kind`.

  Args:
    answer: the text returned for every prompt.
  """

  def __init__(self, answer: str = "Output (a)"):
    self.answer = answer
    self.model_id = f"constant:{answer}"

  def __call__(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    return [self.answer for _ in prompts]
