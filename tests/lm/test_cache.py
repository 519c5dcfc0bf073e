"""The resumable JSON-lines cache (`lm/cache.py`): round trip, a torn line, the key; cached_map dedupes,
resumes and keeps order."""
import pytest

from iclr24_jax import lm


def test_cache_roundtrip_values_torn_line_and_key(tmp_path):
  path = tmp_path / "sub" / "c.jsonl"
  c = lm.GenerationCache(path)
  k1 = lm.cache_key("m", "p", {"max_new_tokens": 5})
  assert k1 != lm.cache_key("m", "p", {"max_new_tokens": 6}) != lm.cache_key("m2", "p", {"max_new_tokens": 5})
  assert k1 == lm.cache_key("m", "p", {"max_new_tokens": 5})
  c.put(k1, "hello")
  c.put_many({"k2": [-1.5, -0.25]}, meta={"kind": "choice"})
  with open(path, "a") as f:
    f.write('{"key": "torn", "te')  # an interrupted write
  again = lm.GenerationCache(path)
  assert again.get(k1) == "hello" and again.get("k2") == [-1.5, -0.25] and again.skipped_lines == 1
  assert again.get("torn") is None and (again.hits, again.misses) == (2, 1)
  with pytest.raises(TypeError, match="str or a list of floats"):
    c.put("k3", {"a": 1})
  with pytest.raises(ValueError, match="finite"):
    c.put("k4", [float("nan")])
  with pytest.raises(ValueError, match="model_id"):
    lm.cache_key("", "p")


def test_cached_map_dedupes_resumes_and_keeps_order(tmp_path):
  calls = []
  def fn(prompts):
    calls.append(list(prompts))
    return [[float(len(p)), -1.0] for p in prompts]
  prompts = ["ccc", "a", "bb", "a", "dddd"]
  cache = lm.GenerationCache(tmp_path / "c.jsonl")
  out = lm.cached_map(fn, prompts, cache, model_id="m", settings={"o": 2}, chunk_size=2)
  assert out == [[3.0, -1.0], [1.0, -1.0], [2.0, -1.0], [1.0, -1.0], [4.0, -1.0]]
  assert calls == [["a", "bb"], ["ccc", "dddd"]]  # unique prompts, shortest first, in chunks
  calls.clear()
  resumed = lm.GenerationCache(tmp_path / "c.jsonl")
  assert lm.cached_map(fn, prompts + ["eeeee"], resumed, model_id="m", settings={"o": 2}) == out + [[5.0, -1.0]]
  assert calls == [["eeeee"]] and resumed.hits == 4
  with pytest.raises(ValueError, match="model id"):
    lm.cached_map(fn, prompts, cache)
  with pytest.raises(ValueError, match="one value per prompt"):
    lm.cached_map(lambda ps: ["x"], ["p", "q"])
