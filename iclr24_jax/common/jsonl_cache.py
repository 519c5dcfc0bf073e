"""A resumable on-disk cache of expensive host-side results (LM generations, scores, annotations), JSON lines.

One line per entry, `{"key": k, "value": v, ...meta}`, appended and flushed (fsync) as soon as a chunk of work is
done, so an interrupted run loses at most the chunk in flight and the next run resumes from the file. A line torn
by an interrupted write is skipped when read (counted in `skipped_lines`), and the next append starts on a fresh
line so the torn bytes never swallow a good record. `cached_map` is the one loop over such a cache: identical
inputs are computed once, cached ones are reused, the rest go to the worker in chunks.

  cache = JsonlCache("runs/x/scores.jsonl")
  keys = [digest([model_id, "expected", prompt]) for prompt in prompts]
  scores = cached_map(score_batch, prompts, keys, cache, chunk_size=32)

Layers that add their own logic subclass `JsonlCache` (`lm.GenerationCache` checks values and writes text under
'text'; papers add their key functions); none re-implements the file handling.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Hashable, Mapping, Sequence


def digest(obj: Any, sort_keys: bool = False, algorithm: str = "sha256") -> str:
  """The hex digest of `obj` as JSON (non-ASCII kept, unknown types by str): a cache key that names its inputs.

  Args:
    obj: what decides the cached value (a list of model id, prompt text, settings ...).
    sort_keys: sort dict keys first (a settings dict built in any order gives one key).
    algorithm: a `hashlib` algorithm name.

  Returns:
    the hex digest (64 characters for sha256).
  """
  blob = json.dumps(obj, sort_keys=sort_keys, ensure_ascii=False, default=str)
  return hashlib.new(algorithm, blob.encode("utf-8")).hexdigest()


class JsonlCache:
  """{key: value} kept in memory and mirrored to an append-only JSON-lines file.

  Subclasses change how a value is checked (`_check`), written (`_encode`) and read back (`_decode`).

  Args:
    path: the .jsonl file (created with its folder on the first write; read if it exists), or None for a cache
      held in memory only.

  Attributes:
    path: the file, or None.
    skipped_lines: lines of the file that could not be read (torn by an interrupted write).
    hits, misses: `get` calls that found / did not find a value.
  """

  def __init__(self, path: str | os.PathLike | None = None):
    self.path = None if path is None else os.fspath(path)
    self._data: dict[str, Any] = {}
    self.skipped_lines = 0
    self.hits = 0
    self.misses = 0
    if self.path is not None and os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        for line in f:
          line = line.strip()
          if not line:
            continue
          try:
            rec = json.loads(line)
            self._data[rec["key"]] = self._decode(rec)
          except (json.JSONDecodeError, KeyError, TypeError):
            self.skipped_lines += 1   # a line torn by an interrupted write: its entry is computed again

  # The three hooks a layer overrides.
  def _check(self, key: str, value: Any) -> Any:
    """The value to store (a layer raises a named error on a value it cannot keep)."""
    del key
    return value

  def _encode(self, value: Any) -> dict[str, Any]:
    """The line's fields besides 'key'."""
    return {"value": value}

  def _decode(self, rec: Mapping[str, Any]) -> Any:
    """The value of a line read back (KeyError / TypeError: the line is skipped)."""
    return rec["value"]

  def __len__(self) -> int:
    return len(self._data)

  def __contains__(self, key: str) -> bool:
    return key in self._data

  def get(self, key: str) -> Any:
    """The cached value, or None (counts hits and misses).

    Args:
      key: the entry's key.

    Returns:
      the value, or None when absent.
    """
    value = self._data.get(key)
    if value is None:
      self.misses += 1
    else:
      self.hits += 1
    return value

  def put_many(self, items: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> None:
    """Stores values and appends them to the file in one flushed write.

    Args:
      items: {key: value} (values JSON-serialisable, as the layer's `_check` allows).
      meta: extra fields written beside each line (e.g. {'kind': 'direct'}); not read back.
    """
    if not items:
      return
    checked = {key: self._check(key, value) for key, value in items.items()}
    self._data.update(checked)
    if self.path is None:
      return
    lines = []
    for key, value in checked.items():
      rec = {"key": key, **self._encode(value)}
      rec.update({k: v for k, v in (meta or {}).items() if k not in rec})
      lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    with open(self.path, "a+", encoding="utf-8") as f:
      f.seek(0, os.SEEK_END)
      if f.tell() > 0:
        f.seek(f.tell() - 1)
        if f.read(1) != "\n":   # the last line was torn by an interruption: start a fresh line after it
          f.write("\n")
      f.writelines(lines)
      f.flush()
      os.fsync(f.fileno())

  def put(self, key: str, value: Any, meta: Mapping[str, Any] | None = None) -> None:
    """Stores one value (see `put_many`).

    Args:
      key: the entry's key.
      value: the value.
      meta: extra fields written beside the line.
    """
    self.put_many({key: value}, meta)


def cached_map(fn: Callable[[list[Any]], Sequence[Any]], items: Sequence[Any], keys: Sequence[Hashable],
               cache: JsonlCache | None = None, *, chunk_size: int = 64,
               sort_key: Callable[[Any], Any] | None = None, meta: Mapping[str, Any] | None = None,
               progress: Callable[[int, int], None] | None = None, what: str = "item") -> list[Any]:
  """`[fn(item) for item in items]`, with de-duplication by key, caching and resumability.

  Items with equal keys are computed once (the first of them is passed); cached values are reused; the rest go
  to `fn` in chunks, each chunk stored in the cache (and flushed to its file) before the next starts.

  Args:
    fn: a list of up to `chunk_size` items -> one value per item, in order.
    items: N inputs.
    keys: N keys (the value of an item is a function of its key: a digest of everything that decides it).
    cache: a `JsonlCache` (None: an in-memory one for this call).
    chunk_size: items per `fn` call and per cache write.
    sort_key: order in which the missing items are computed (e.g. `len`: short prompts together pad little);
      None keeps their first-seen order.
    meta: extra fields written beside each cached line.
    progress: called after each chunk with (items computed so far, items to compute in this call).
    what: the name of an item in error messages ('prompt', 'pair' ...).

  Returns:
    N values in the order of `items`.

  Raises:
    ValueError: keys and items of different lengths, chunk_size < 1, or `fn` returning the wrong number of values.
  """
  items, keys = list(items), list(keys)
  if len(items) != len(keys):
    raise ValueError(f"cached_map needs one key per {what}: {len(items)} {what}s but {len(keys)} keys.")
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
  cache = JsonlCache(None) if cache is None else cache
  first: dict[Hashable, Any] = {}
  for key, item in zip(keys, items):
    first.setdefault(key, item)
  values: dict[Hashable, Any] = {}
  for k in first:
    hit = cache.get(k)   # counts the cache's hits and misses once per distinct key
    if k in cache:
      values[k] = hit
  todo = [k for k in first if k not in values]
  if sort_key is not None:
    todo.sort(key=lambda k: sort_key(first[k]))
  for start in range(0, len(todo), chunk_size):
    chunk = todo[start:start + chunk_size]
    out = fn([first[k] for k in chunk])
    if isinstance(out, (str, bytes)) or not hasattr(out, "__len__") or len(out) != len(chunk):
      raise ValueError(f"fn must return one value per {what} ({len(chunk)}), got {type(out).__name__} of length "
                       f"{len(out) if hasattr(out, '__len__') else '?'}.")
    new = dict(zip(chunk, out))
    cache.put_many(new, meta)
    values.update((k, cache._data[k]) for k in new)   # as stored (the layer's `_check` may normalise a value)
    if progress is not None:
      progress(start + len(chunk), len(todo))
  return [values[k] for k in keys]
