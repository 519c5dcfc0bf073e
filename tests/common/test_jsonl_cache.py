"""common.jsonl_cache: the one resumable JSON-lines cache (append, resume, torn lines, de-duplication)."""
import hashlib
import json

import numpy as np
import pytest

from iclr24_jax.common import jsonl_cache


def test_digest_is_sha256_of_the_json_text():
  # Independent reference: hashlib over the exact JSON text the docstring promises.
  obj = ["m", "é", {"b": 1, "a": 2}]
  want = hashlib.sha256('["m", "é", {"b": 1, "a": 2}]'.encode("utf-8")).hexdigest()
  assert jsonl_cache.digest(obj) == want
  sorted_want = hashlib.sha256('["m", "é", {"a": 2, "b": 1}]'.encode("utf-8")).hexdigest()
  assert jsonl_cache.digest(obj, sort_keys=True) == sorted_want
  assert len(jsonl_cache.digest(obj, algorithm="sha1")) == 40


def test_append_resume_and_torn_line_starts_a_fresh_line(tmp_path):
  path = tmp_path / "sub" / "c.jsonl"
  c = jsonl_cache.JsonlCache(path)
  c.put_many({"a": {"x": 1}, "b": [1.5, 2.0]}, meta={"kind": "t"})
  with open(path, "a") as f:
    f.write('{"key": "torn", "va')                      # an interrupted write, no newline
  again = jsonl_cache.JsonlCache(path)
  assert len(again) == 2 and again.skipped_lines == 1
  assert again.get("a") == {"x": 1} and again.get("b") == [1.5, 2.0] and again.get("torn") is None
  assert (again.hits, again.misses) == (2, 1)
  again.put("c", "text")                               # must not be glued onto the torn bytes
  lines = path.read_text().splitlines()
  assert lines[-2] == '{"key": "torn", "va' and json.loads(lines[-1]) == {"key": "c", "value": "text"}
  assert json.loads(lines[0]) == {"key": "a", "value": {"x": 1}, "kind": "t"}
  third = jsonl_cache.JsonlCache(path)
  assert len(third) == 3 and third.skipped_lines == 1 and third.get("c") == "text"
  mem = jsonl_cache.JsonlCache(None)                   # in memory: nothing written
  mem.put("k", 1)
  assert mem.get("k") == 1 and mem.path is None


def test_cached_map_dedupes_orders_chunks_and_resumes(tmp_path):
  calls = []

  def fn(items):
    calls.append(list(items))
    return [len(s) * 10 for s in items]

  items = ["ccc", "a", "bb", "a", "dddd"]
  keys = [jsonl_cache.digest(["m", s]) for s in items]
  cache = jsonl_cache.JsonlCache(tmp_path / "c.jsonl")
  seen = []
  out = jsonl_cache.cached_map(fn, items, keys, cache, chunk_size=2, sort_key=len,
                               progress=lambda d, t: seen.append((d, t)))
  assert out == [30, 10, 20, 10, 40]
  assert calls == [["a", "bb"], ["ccc", "dddd"]]       # 4 distinct items, shortest first, 2 per call
  assert seen == [(2, 4), (4, 4)]
  calls.clear()
  resumed = jsonl_cache.JsonlCache(tmp_path / "c.jsonl")
  more = items + ["eeeee"]
  out2 = jsonl_cache.cached_map(fn, more, keys + [jsonl_cache.digest(["m", "eeeee"])], resumed)
  assert out2 == out + [50] and calls == [["eeeee"]]
  assert (resumed.hits, resumed.misses) == (4, 1)      # one lookup per distinct key
  assert jsonl_cache.cached_map(fn, ["x", "y"], ["k1", "k2"]) == [10, 10]   # no cache: in memory
  with pytest.raises(ValueError, match="one value per pair"):
    jsonl_cache.cached_map(lambda xs: [1], ["p", "q"], ["1", "2"], what="pair")
  with pytest.raises(ValueError, match="one key per item"):
    jsonl_cache.cached_map(fn, ["p", "q"], ["1"])
  with pytest.raises(ValueError, match="chunk_size"):
    jsonl_cache.cached_map(fn, ["p"], ["1"], chunk_size=0)


def test_a_crash_keeps_the_finished_chunks(tmp_path):
  path = tmp_path / "c.jsonl"
  state = {"calls": 0}

  def crashing(items):
    state["calls"] += 1
    if state["calls"] == 2:
      raise RuntimeError("killed")
    return [np.float64(len(s)).item() for s in items]

  items = ["a", "bb", "ccc", "dddd"]
  with pytest.raises(RuntimeError, match="killed"):
    jsonl_cache.cached_map(crashing, items, items, jsonl_cache.JsonlCache(path), chunk_size=2)
  resumed = jsonl_cache.JsonlCache(path)
  assert len(resumed) == 2                             # the first chunk was flushed before the crash
  assert jsonl_cache.cached_map(lambda xs: [float(len(s)) for s in xs], items, items, resumed) == [1.0, 2.0, 3.0,
                                                                                                     4.0]
