"""Readers of the shared text sets: counts and fields of the real files, and named errors."""
import pytest

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import textdata

needs_data = pytest.mark.skipif(data_lib.shared_data_dir() is None,
                                reason="../shared/data (or $ICLR24_DATA) is absent: the shared text sets are needed")


@needs_data
def test_mario_counts_and_placeholders():
  sqa = textdata.load_mario("strategyqa", "test")
  assert len(sqa) == 458 and sqa[0]["answer"] in ("yes", "no") and sqa[0]["has_rationale"]
  assert sqa[0]["choices"] == ["yes", "no"]
  qd = textdata.load_mario("quarel", "dev")
  assert not any(r["has_rationale"] for r in qd)  # QuaRel dev rationales are the string "dummy"
  qt = textdata.load_mario("quarel", "train")
  assert len(qt) == 8203 and len(qt[0]["choices"]) == 2 and qt[0]["answer"] == "(B)"
  ob = textdata.load_mario("obqa", "test")
  assert len(ob) == 498 and len(ob[0]["choices"]) == 4


@needs_data
def test_hh_rlhf_and_llmbar():
  hh = textdata.load_hh_rlhf()
  assert len(hh) == 2312 and hh[0]["chosen"].startswith("\n\nHuman:")
  history, reply = textdata.split_dialogue(hh[0]["chosen"])
  assert history.endswith("Assistant:") and reply and "Assistant:" not in reply
  bar = textdata.load_llmbar()
  assert len(bar) == 419 and {r["label"] for r in bar} == {1, 2}
  assert [sum(r["subset"] == s for r in bar) for s in textdata.LLMBAR_SUBSETS] == [100, 134, 92, 47, 46]


def test_errors_name_the_fix(tmp_path):
  with pytest.raises(FileNotFoundError, match="ICLR24_DATA"):
    textdata.load_mario("strategyqa", "test", data_dir=tmp_path)
  with pytest.raises(ValueError, match="splits"):
    textdata.load_mario("obqa", "train", data_dir=tmp_path)
  with pytest.raises(ValueError, match="unknown MaRio"):
    textdata.load_mario("squad", "train", data_dir=tmp_path)
  with pytest.raises(ValueError, match="Assistant"):
    textdata.split_dialogue("no turns here")
