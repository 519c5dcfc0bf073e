"""A resumable on-disk cache of LM outputs (generations or scores), JSON lines, append-only.

Key = SHA-256 of (model id, prompt, decoding/scoring settings), so changing the model, the prompt wording, the
token budget, the logit bias or the scored options never reuses a stale answer. Each finished chunk is appended
and flushed at once; an interrupted run loses at most the chunk in flight and resumes from the file (a torn last
line is skipped).

  cache = GenerationCache("runs/x/generations.jsonl")
  texts = cached_map(lambda ps: judge(ps, 32), prompts, cache, model_id="SmolLM2", settings={"max_new_tokens": 32})

Values are text (a generation) or a list of floats (e.g. the log-probabilities of the options of one prompt).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Callable, Mapping, Sequence


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
  blob = json.dumps({"model": str(model_id), "prompt": prompt, "settings": dict(settings or {})}, sort_keys=True,
                    ensure_ascii=False, default=str)
  return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _check_value(key: str, value: Any) -> Any:
  if isinstance(value, str):
    return value
  if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in value):
    vals = [float(v) for v in value]
    if not all(math.isfinite(v) for v in vals):
      raise ValueError(f"cached scores must be finite, got {vals} for key {key[:12]}.")
    return vals
  raise TypeError(f"cached values must be str or a list of floats, got {type(value).__name__} for key {key[:12]}.")


class GenerationCache:
  """{key: text or list of floats} kept in memory and mirrored to `path` (one JSON object per line).

  Args:
    path: the .jsonl file (created with its folder on first write; read if it exists).
  """

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self._data: dict[str, Any] = {}
    self.skipped_lines = 0
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        for line in f:
          line = line.strip()
          if not line:
            continue
          try:
            rec = json.loads(line)
            self._data[rec["key"]] = rec["text"] if "text" in rec else rec["value"]
          except (json.JSONDecodeError, KeyError, TypeError):
            self.skipped_lines += 1  # a line torn by an interrupted write
    self.hits = 0
    self.misses = 0

  def __len__(self) -> int:
    return len(self._data)

  def __contains__(self, key: str) -> bool:
    return key in self._data

  def get(self, key: str) -> Any:
    """The cached value or None (counts hits and misses)."""
    value = self._data.get(key)
    if value is None:
      self.misses += 1
    else:
      self.hits += 1
    return value

  def put_many(self, items: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> None:
    """Stores several values (str, or a list of finite floats) and appends them to the file in one flushed write.

    Args:
      items: {key: value}.
      meta: extra fields written beside each record (e.g. {'kind': 'direct'}); not read back.
    """
    if not items:
      return
    lines = []
    for key, value in items.items():
      value = _check_value(key, value)
      self._data[key] = value
      rec = {"key": key, ("text" if isinstance(value, str) else "value"): value}
      if meta:
        rec.update({k: v for k, v in meta.items() if k not in rec})
      lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    with open(self.path, "a", encoding="utf-8") as f:
      f.writelines(lines)
      f.flush()
      os.fsync(f.fileno())

  def put(self, key: str, value: Any, meta: Mapping[str, Any] | None = None) -> None:
    """Stores one value (see `put_many`).

    Args:
      key: the cache key.
      value: a str, or a list of finite floats.
      meta: extra fields written beside the record (not read back).
    """
    self.put_many({key: value}, meta)


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
  if not prompts:
    return []
  if cache is not None and not model_id:
    raise ValueError("caching needs a model id: pass model_id= (e.g. judge.model_id).")
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
  keys = [cache_key(model_id, p, settings) if cache is not None else p for p in prompts]
  values: dict[str, Any] = {}
  if cache is not None:
    for k in dict.fromkeys(keys):
      hit = cache.get(k)
      if hit is not None:
        values[k] = hit
  first = {k: prompts[i] for i, k in reversed(list(enumerate(keys)))}
  todo = sorted((k for k in dict.fromkeys(keys) if k not in values), key=lambda k: len(first[k]))
  for start in range(0, len(todo), chunk_size):
    chunk = todo[start:start + chunk_size]
    out = fn([first[k] for k in chunk])
    if isinstance(out, (str, bytes)) or not hasattr(out, "__len__") or len(out) != len(chunk):
      raise ValueError(f"fn must return one value per prompt ({len(chunk)}), got {type(out).__name__} of length "
                       f"{len(out) if hasattr(out, '__len__') else '?'}.")
    new = {k: (v if isinstance(v, str) else [float(x) for x in v]) for k, v in zip(chunk, out)}
    values.update(new)
    if cache is not None:
      cache.put_many(new, meta)
    if on_chunk is not None:
      on_chunk(len(chunk))
  return [values[k] for k in keys]
