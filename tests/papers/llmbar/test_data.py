"""LLMBar data (`papers/llmbar/data.py`): the real subsets and clear load errors."""
import json

import pytest

from iclr24_jax.papers import llmbar
from iclr24_jax.papers.llmbar import data as data_lib


def test_load_real_data(shared_data):
  data = llmbar.load(shared_data / "llmbar")
  assert {k: len(v) for k, v in data.items()} == data_lib.SUBSET_SIZES
  assert sum(len(v) for v in data.values()) == 419
  assert all(x.label in (1, 2) and x.input and x.subset == k for k, v in data.items() for x in v)
  sub = llmbar.stratified_subset(data, 3, seed=0)
  assert {k: len(v) for k, v in sub.items()} == {k: 3 for k in data}
  assert [x.uid for x in sub["Manual"]] == [x.uid for x in llmbar.stratified_subset(data, 3, seed=0)["Manual"]]
  assert llmbar.stratified_subset(data, 0) == data


def test_load_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    llmbar.load(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match="Natural/dataset.json"):
    llmbar.load(tmp_path)
  with pytest.raises(ValueError, match="unknown LLMBar subsets"):
    llmbar.load(tmp_path, ["Natural", "Hard"])
  (tmp_path / "Natural").mkdir()
  (tmp_path / "Natural" / "dataset.json").write_text(json.dumps([{"input": "x", "output_1": "a", "output_2": "b",
                                                                  "label": 3}]))
  with pytest.raises(ValueError, match="label must be 1 or 2"):
    llmbar.load(tmp_path, ["Natural"])
