"""The text-set loaders (llmbar, mario, cpm, lm_inversion, finetune_dissect) on tiny files written as their
publishers ship them: LLMBar JSON lists, MaRio's keyed JSON objects, HH-RLHF gzipped JSON lines, SHP JSON lines,
and parquet in the HF hub layout (data/<split>-00000-of-00001.parquet)."""
import json

import pytest

from iclr24_jax.common import data as common_data
from iclr24_jax.papers.cpm import data as cpm_data
from iclr24_jax.papers.finetune_dissect import data as fd_data
from iclr24_jax.papers.llmbar import data as llmbar_data
from iclr24_jax.papers.lm_inversion import data as inv_data
from iclr24_jax.papers.mario import data as mario_data


def _llmbar(root):
  for sub, n in (("Natural", 2), ("Adversarial/Neighbor", 1), ("Adversarial/GPTInst", 1), ("Adversarial/GPTOut", 1),
                 ("Adversarial/Manual", 1)):
    (root / sub).mkdir(parents=True)
    recs = [{"input": f"q{i}", "output_1": "a", "output_2": "b", "label": 1 + i % 2} for i in range(n)]
    (root / sub / "dataset.json").write_text(json.dumps(recs))


def test_llmbar(tmp_path):
  _llmbar(tmp_path)
  out = llmbar_data.load({"name": "llmbar", "data_dir": str(tmp_path), "subsets": ()})
  assert {k: len(v) for k, v in out.items()} == {"Natural": 2, "Neighbor": 1, "GPTInst": 1, "GPTOut": 1, "Manual": 1}
  assert [x.label for x in out["Natural"]] == [1, 2] and out["Natural"][1].uid == "Natural/1"
  assert list(llmbar_data.load(str(tmp_path), ["Manual"])) == ["Manual"]      # the older (folder, subsets) form
  (tmp_path / "Natural" / "dataset.json").write_text(json.dumps([{"input": "q", "output_1": "a", "output_2": "b",
                                                                  "label": 3}]))
  with pytest.raises(ValueError, match="label must be 1 or 2"):
    llmbar_data.load({"name": "llmbar", "data_dir": str(tmp_path)})
  with pytest.raises(common_data.DataNotFoundError, match="princeton-nlp/LLMBar"):
    llmbar_data.load({"name": "llmbar", "data_dir": str(tmp_path / "nope")})


def test_mario_keyed_json(tmp_path):
  raw = tmp_path / "quarel" / "raw"
  raw.mkdir(parents=True)
  rec = lambda r: {"question": "Which is faster? (A) car (B) snail", "rationale": r, "answer": "(A)"}
  for split, r in (("train", "Cars move faster."), ("dev", "dummy"), ("test", "dummy")):
    (raw / f"{split}.jsonl").write_text(json.dumps({"0": rec(r), "1": rec(r)}))   # ONE object keyed "0".."N-1"
  out = mario_data.load({"name": "quarel", "data_dir": str(tmp_path)})
  assert {k: len(v) for k, v in out.items()} == {"train": 2, "dev": 2, "test": 2}
  assert out["train"][0]["has_rationale"] and not out["test"][0]["has_rationale"]   # 'dummy' = no silver rationale
  assert out["train"][0]["choices"] == ["car", "snail"]
  with pytest.raises(common_data.DataNotFoundError, match="strategyqa/train"):
    mario_data.load({"name": "strategyqa", "data_dir": str(tmp_path)})


def test_hh_rlhf_and_shp(tmp_path, write_jsonl):
  hist = "\n\nHuman: Hi there\n\nAssistant: Hello.\n\nHuman: Help me?"
  rows = [{"chosen": hist + "\n\nAssistant: Sure.", "rejected": hist + "\n\nAssistant: No."},
          {"chosen": "\n\nHuman: A\n\nAssistant: x", "rejected": "\n\nHuman: B\n\nAssistant: y"}]   # histories differ
  for split in ("train", "test"):
    write_jsonl(tmp_path / "hh" / "helpful-base" / f"{split}.jsonl.gz", rows)
  out = cpm_data.load({"name": "hh_rlhf", "data_dir": str(tmp_path / "hh")})
  assert {k: len(v) for k, v in out.items()} == {"train": 1, "test": 1}   # the pair with two histories is dropped
  assert out["test"][0] == {"history": hist.strip(), "chosen": "Sure.", "rejected": "No.",
                            "source": "helpful-base/0"}
  shp = [{"history": "post", "human_ref_A": "a", "human_ref_B": "b", "labels": 0},
         {"history": "post2", "human_ref_A": "c", "human_ref_B": "d", "labels": 1}]
  write_jsonl(tmp_path / "shp" / "askscience" / "test.json", shp)      # SHP: JSON lines despite '.json'
  out = cpm_data.load({"name": "shp", "data_dir": str(tmp_path / "shp"), "splits": ("test",)})
  assert [(r["chosen"], r["rejected"]) for r in out["test"]] == [("b", "a"), ("c", "d")]   # labels 1: A preferred
  with pytest.raises(common_data.DataNotFoundError, match="hh-rlhf"):
    cpm_data.load({"name": "hh_rlhf", "data_dir": str(tmp_path / "shp")})


def test_lm_inversion_instructions_parquet(tmp_path, write_parquet):
  rows = [{"system": f" sys{i} ", "user": f"user {i}\n"} for i in range(200)]
  write_parquet(tmp_path / "omi" / "data" / "train-00000-of-00001.parquet", rows)
  out = inv_data.load({"name": "instructions_2m", "data_dir": str(tmp_path / "omi"), "seed": 0})
  # vec2text create_ompi_ex: system.strip() + "\n\n" + user.strip(); 1% of 200 = 2 held out
  assert len(out["train"]) == 198 and len(out["test"]) == 2
  assert sorted(out["train"] + out["test"]) == sorted(f"sys{i}\n\nuser {i}" for i in range(200))
  write_parquet(tmp_path / "hh" / "data" / "train-00000-of-00001.parquet", [{"user": "first prompt"}])
  assert inv_data.load({"name": "anthropic_hh_first_prompt", "data_dir": str(tmp_path / "hh")}) == {
      "train": [], "test": ["first prompt"]}
  with pytest.raises(common_data.DataFormatError, match="instruction"):
    inv_data.load({"name": "python_code_alpaca", "data_dir": str(tmp_path / "hh")})


def test_finetune_dissect_pubmed_layouts(tmp_path, write_parquet):
  for split in fd_data.DERIVED_SPLITS:
    write_parquet(tmp_path / "pd" / "data" / f"{split}-00000-of-00001.parquet",
                  [{"text": f"{split} one", "PubmedData": {"PublicationStatus": "ppublish"}}, {"text": f"{split} two"}])
  out = fd_data.load({"name": "pubmed_derived", "data_dir": str(tmp_path / "pd")})
  assert list(out) == list(fd_data.DERIVED_SPLITS) and out["rap"] == ["rap one", "rap two"]
  cit = lambda t: {"MedlineCitation": {"PMID": 1, "Article": {"Abstract": {"AbstractText": t}, "ArticleTitle": "T"}}}
  write_parquet(tmp_path / "pm" / "data" / "train-00000-of-00001.parquet", [cit(" An abstract. "), cit(""), cit("B")])
  out = fd_data.load({"name": "pubmed", "data_dir": str(tmp_path / "pm")})
  assert out == {"train": ["An abstract.", "B"]}                          # empty abstracts are dropped
  with pytest.raises(common_data.DataNotFoundError, match="no 'casual' split"):
    fd_data.load({"name": "pubmed_derived", "data_dir": str(tmp_path / "pm"), "splits": ("casual",)})
