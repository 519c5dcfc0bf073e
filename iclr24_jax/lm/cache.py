"""A resumable on-disk cache of LM outputs (generations or scores): the LM layer on `common.jsonl_cache`.

Key = SHA-256 of (model id, prompt, decoding/scoring settings), so changing the model, the prompt wording, the
token budget, the logit bias or the scored options never reuses a stale answer. Each finished chunk is appended
and flushed at once; an interrupted run loses at most the chunk in flight and resumes from the file (a torn last
line is skipped).

  cache = GenerationCache("runs/x/generations.jsonl")
  texts = cached_map(lambda ps: judge(ps, 32), prompts, cache, model_id="SmolLM2", settings={"max_new_tokens": 32})

Values are text (a generation) or a list of floats (e.g. the log-probabilities of the options of one prompt).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from iclr24_jax.common import jsonl_cache


def cache_key(model_id: str, prompt: str, settings: Mapping[str, Any] | None = None) -> str:
  """SHA-256 hex digest of the model id, the exact prompt text and the settings (JSON, sorted keys).

  Args:
    model_id: names the model and its weights (e.g. 'SmolLM2-135M-Instruct/Q4_1-gguf/float32').
    prompt: the exact prompt text.
    settings: everything else that decides the output (max_new_tokens, temperature, logit bias, options...).

  Returns:
    64 hex characters.
  """
  if not model_id:
    raise ValueError("cache_key needs a non-empty model_id (name the model, e.g. 'SmolLM2-135M-Instruct').")
  return jsonl_cache.digest({"model": str(model_id), "prompt": prompt, "settings": dict(settings or {})},
                            sort_keys=True)


def _check_value(key: str, value: Any) -> Any:
  if isinstance(value, str):
    return value
  if isinstance(value, np.ndarray) and value.ndim == 1 and np.issubdtype(value.dtype, np.number):
    value = value.tolist()   # a worker's row of scores
  if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                                               for v in value):
    vals = [float(v) for v in value]
    if not all(math.isfinite(v) for v in vals):
      raise ValueError(f"cached scores must be finite, got {vals} for key {key[:12]}.")
    return vals
  raise TypeError(f"cached values must be str or a list of floats, got {type(value).__name__} for key {key[:12]}.")


class GenerationCache(jsonl_cache.JsonlCache):
  """{key: text or list of floats} mirrored to `path`: a `common.jsonl_cache.JsonlCache` whose values are checked
  (a str, or a list of finite floats) and whose text is written under 'text' (a generation reads as one).

  Args:
    path: the .jsonl file (created with its folder on first write; read if it exists).
  """

  def _check(self, key: str, value: Any) -> Any:
    return _check_value(key, value)

  def _encode(self, value: Any) -> dict[str, Any]:
    return {"text": value} if isinstance(value, str) else {"value": value}

  def _decode(self, rec: Mapping[str, Any]) -> Any:
    return rec["text"] if "text" in rec else rec["value"]


def cached_map(fn: Callable[[list[str]], Sequence[Any]], prompts: Sequence[str],
               cache: GenerationCache | None = None, model_id: str | None = None,
               settings: Mapping[str, Any] | None = None, chunk_size: int = 64, meta: Mapping[str, Any] | None = None,
               on_chunk: Callable[[int], None] | None = None) -> list[Any]:
  """Applies `fn` to prompts with de-duplication, caching and resumability.

  Identical prompts are computed once; cached values are reused; the rest go to `fn` in chunks (shortest
  prompts first, so a chunk pads little), each chunk written to the cache as soon as it is done.

  Args:
    fn: list of prompts -> one value per prompt (str or list of floats).
    prompts: N prompt strings.
    cache: optional GenerationCache (None: no caching, still de-duplicated and chunked).
    model_id: the model's name in the key (required with a cache).
    settings: what else decides the output (enters the key).
    chunk_size: prompts per `fn` call (and per cache write).
    meta: extra fields written beside each cached record.
    on_chunk: called with the number of prompts just computed (progress).

  Returns:
    N values in the order of `prompts`.
  """
  if isinstance(prompts, str):
    raise TypeError("cached_map takes a list of prompts, got one str; wrap it in a list.")
  prompts = list(prompts)
  if cache is not None and not model_id:
    raise ValueError("caching needs a model id: pass model_id= (e.g. judge.model_id).")
  keys = [cache_key(model_id, p, settings) for p in prompts] if cache is not None else prompts
  done = [0]

  def progress(n_done: int, total: int) -> None:
    del total
    if on_chunk is not None:
      on_chunk(n_done - done[0])
    done[0] = n_done

  return jsonl_cache.cached_map(fn, prompts, keys, cache if cache is not None else GenerationCache(None),
                                chunk_size=chunk_size, sort_key=len, meta=meta, progress=progress, what="prompt")
