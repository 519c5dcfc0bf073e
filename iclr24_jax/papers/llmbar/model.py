"""Judges: the LLM inside an LLMBar evaluator (built on the annotator kit of `iclr24_jax.lm`).

A judge is any callable `judge(prompts: list[str], max_new_tokens) -> list[str]` that answers ChatML
prompts (what `build_prompt` returns). A judge that sets `accepts_kind = True` is also told what the call is
for (`kind` in 'metrics', 'reference', 'direct', 'cot', 'rating') and may decode differently per kind; that is
how the logit bias toward "Output (a)"/"Output (b)" reaches direct answers only. A judge may expose `model_id`
and `decoding_settings(kind)`, which enter the generation-cache key. For `judge_mode='logprob'` a judge also
has `choice_logprobs(prompts, options) -> [P, O]` (and `scoring_settings()` for the cache key).

`SmolLMJudge` is `lm.SmolLMJudge` (SmolLM2-135M-Instruct, greedy, batched, KV cache) with the official logit
bias mapped onto its tokenizer; `FakeJudge` is `lm.FakeJudge` with LLMBar's answer formats; `ConstantJudge`
comes from `lm` unchanged. All three are deterministic except for the model itself.
"""
from __future__ import annotations

from typing import Callable, Sequence

from iclr24_jax import lm
from iclr24_jax.lm import tokenizer as tok_lib
from iclr24_jax.lm.annotate import SMOLLM2_ID, stable_hash
from iclr24_jax.papers.llmbar import prompts as prompts_lib

KINDS = ("metrics", "reference", "direct", "cot", "rating", "free")
DEFAULT_WIDTHS = (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
ANSWER_OPTIONS = ("Output (a)", "Output (b)")  # what a direct answer starts with (log-prob mode scores these)


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
  # official: princeton-nlp/LLMBar@900616b LLMEvaluator/evaluate.py:92-106 (process_openai_kwargs)
  for word in prompts_lib.TOKENS_TO_AVOID:
    ids = tokenizer.encode(word, add_bos=False)
    if len(ids) == 1:
      bias[ids[0]] = avoid
  if kind == "direct":
    for text in prompts_lib.TOKENS_TO_FAVOR:
      for i in tokenizer.encode(text, add_bos=False):
        bias[i] = favor
  return bias


class SmolLMJudge(lm.SmolLMJudge):
  """SmolLM2-135M-Instruct as an LLMBar judge: `lm.SmolLMJudge` with the official per-kind logit bias.

  Args:
    params, config, tokenizer: an `iclr24_jax.lm` Llama (default: `lm.load_smollm2()`).
    batch_size: rows per compiled call.
    logit_bias: apply the official bias for direct/CoT answers (generation only; `choice_logprobs` reads
      the unbiased model).
    widths: allowed padded prompt lengths (tokens); the largest is the longest prompt accepted.
    model_id: the name used in cache keys.
    stop_ids: tokens that end an answer (default: the tokenizer's EOS; () generates exactly max_new_tokens,
      as a benchmark wants).
  """

  def __init__(self, params=None, config=None, tokenizer=None, batch_size: int = 8, logit_bias: bool = True,
               widths: Sequence[int] = DEFAULT_WIDTHS, model_id: str = SMOLLM2_ID,
               stop_ids: Sequence[int] | None = None):
    if params is None:
      # Deviation: the paper's judges are GPT-4 / ChatGPT / LLaMA-2 / PaLM 2 / Falcon; the only LM available
      # offline is SmolLM2-135M-Instruct (its Q4_1 GGUF dequantised to float32).
      params, config, tokenizer = lm.load_smollm2()
    if tokenizer is None:
      raise ValueError("pass params, config and tokenizer together (or none of them to load SmolLM2).")
    # Deviation: the official code biases only the OpenAI models' answer tokens; here the same bias is
    # applied to the local judge (option `logit_bias`), as the issue asks.
    bias = {k: (logit_bias_for(tokenizer, k) if logit_bias else None) for k in KINDS}
    super().__init__(params, config, tokenizer, batch_size=batch_size, logit_bias=bias, widths=widths,
                     model_id=model_id, stop_ids=stop_ids)
    self.use_logit_bias = bool(logit_bias)

  def __call__(self, prompts: Sequence[str], max_new_tokens: int, kind: str = "free",
               batch_size: int | None = None) -> list[str]:
    """Answers ChatML prompts (greedy; `kind` in KINDS picks the bias). See `lm.SmolLMJudge.__call__`."""
    if isinstance(prompts, str):
      raise TypeError("a judge takes a list of prompts, got one str; wrap it in a list.")
    if kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    return super().__call__(prompts, max_new_tokens, kind=kind, batch_size=batch_size)


class FakeJudge(lm.FakeJudge):
  """`lm.FakeJudge` with LLMBar's answer formats: a deterministic chance-level stand-in (a hash of seed +
  prompt) for tests and the tiny config. `choice_logprobs` scores any options (hash noise plus an optional
  known `preference(prompt, option)`).

  Args:
    seed: changes every answer.
    model_id: name used in cache keys.
    preference: optional (prompt, option) -> float added to the option scores.
    noise: scale of the hashed score noise.
  """

  def __init__(self, seed: int = 0, model_id: str | None = None,
               preference: Callable[[str, str], float] | None = None, noise: float = 1.0):
    super().__init__(seed=seed, model_id=model_id, preference=preference, noise=noise)

  def answer(self, prompt: str, kind: str) -> str:
    """A deterministic canned answer of `kind` for a prompt (hash of seed and prompt picks '(a)' or '(b)').

    Args:
      prompt: the judge prompt.
      kind: 'metrics', 'reference', 'cot', 'rating' or anything else (a plain 'Output (a)' / 'Output (b)').

    Returns:
      the answer text.
    """
    h = stable_hash(self.seed, prompt)
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
    return super().__call__(prompts, max_new_tokens, kind=kind)
