"""A resumable on-disk cache of generations (JSON lines, append-only).

Key = SHA-256 of (model id, prompt, decoding settings), so changing the model, the prompt wording, the token
budget or the logit bias never reuses a stale answer. Each finished generation is appended and flushed at
once; an interrupted run loses at most the chunk in flight and resumes from the file (a torn last line is
skipped).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping


def cache_key(model_id: str, prompt: str, settings: Mapping[str, Any] | None = None) -> str:
  """SHA-256 hex digest of the model id, the exact prompt text and the decoding settings (JSON, sorted keys)."""
  if not model_id:
    raise ValueError("cache_key needs a non-empty model_id (name the judge, e.g. 'SmolLM2-135M-Instruct').")
  blob = json.dumps({"model": str(model_id), "prompt": prompt, "settings": dict(settings or {})}, sort_keys=True,
                    ensure_ascii=False, default=str)
  return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class GenerationCache:
  """{key: generated text} kept in memory and mirrored to `path` (one JSON object per line).

  Args:
    path: the .jsonl file (created with its folder on first write; read if it exists).
  """

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self._data: dict[str, str] = {}
    self.skipped_lines = 0
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        for line in f:
          line = line.strip()
          if not line:
            continue
          try:
            rec = json.loads(line)
            self._data[rec["key"]] = rec["text"]
          except (json.JSONDecodeError, KeyError, TypeError):
            self.skipped_lines += 1  # a line torn by an interrupted write
    self.hits = 0
    self.misses = 0

  def __len__(self) -> int:
    return len(self._data)

  def __contains__(self, key: str) -> bool:
    return key in self._data

  def get(self, key: str) -> str | None:
    """The cached text or None (counts hits and misses)."""
    text = self._data.get(key)
    if text is None:
      self.misses += 1
    else:
      self.hits += 1
    return text

  def put_many(self, items: Mapping[str, str], meta: Mapping[str, Any] | None = None) -> None:
    """Stores several generations and appends them to the file in one flushed write."""
    if not items:
      return
    lines = []
    for key, text in items.items():
      if not isinstance(text, str):
        raise TypeError(f"cached generations must be str, got {type(text).__name__} for key {key[:12]}.")
      self._data[key] = text
      rec = {"key": key, "text": text}
      if meta:
        rec.update({k: v for k, v in meta.items() if k not in rec})
      lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    with open(self.path, "a", encoding="utf-8") as f:
      f.writelines(lines)
      f.flush()
      os.fsync(f.fileno())

  def put(self, key: str, text: str, meta: Mapping[str, Any] | None = None) -> None:
    """Stores one generation (see `put_many`)."""
    self.put_many({key: text}, meta)
