"""The paper's corpora in the HF hub's on-disk layout (parquet shards).

- 'pubmed_derived' (xiaozeroone/pubmed_derived, the paper's evaluation corpus): splits pubmed (1,000 abstracts),
  nonbiomedical (topic rewritten), counterfactual (facts altered), casual and rap (style rewritten) as
  data/<split>-*.parquet, column `text`.
- 'pubmed' (the finetuning corpus of the official `run.py`: the HF `pubmed` baseline of MEDLINE citations):
  data/train-*.parquet with the nested MedlineCitation record; the text is
  MedlineCitation.Article.Abstract.AbstractText, empty abstracts dropped.
"""
from __future__ import annotations

from typing import Any

from iclr24_jax.common import data as data_lib

DATASETS = {
    "pubmed_derived": "xiaozeroone/pubmed_derived: data/{pubmed,nonbiomedical,counterfactual,casual,rap}-*.parquet, "
                      "column text",
    "pubmed": "the HF pubmed data set (MEDLINE baseline): data/train-*.parquet (or train/*.arrow), column "
              "MedlineCitation {Article: {Abstract: {AbstractText}}}",
}
DERIVED_SPLITS = ("pubmed", "nonbiomedical", "counterfactual", "casual", "rap")
HF_SOURCE = ("`git clone` of the data set's hub repository (datasets/xiaozeroone/pubmed_derived, datasets/ncbi/"
             "pubmed), or `datasets.load_dataset(...).save_to_disk(<dir>)` where the hub is reachable")


def _abstract(record: dict) -> str:
  cit = record.get("MedlineCitation") or {}
  art = cit.get("Article") or {}
  abstract = art.get("Abstract") or {}
  return str(abstract.get("AbstractText") or "").strip()


def load(data_config: Any) -> dict[str, list[str]]:
  """The texts of `config.data.name` per split.

  Args:
    data_config: config.data with `name` (a key of DATASETS), `data_dir` (the data set's folder) and optionally
      `splits` (default: the five pubmed_derived splits, or ('train',) for pubmed) and `max_documents` (0: all).

  Returns:
    {split: [text, ...]} in file order.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: a split is missing.
    common.data.DataFormatError: the parquet lacks the text column.
  """
  name = data_lib.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown finetune_dissect data set '{name}'; choose one of {sorted(DATASETS)}.")
  root = data_lib.locate_data(data_config, name, what=name, layout=DATASETS[name], source=HF_SOURCE)
  default = DERIVED_SPLITS if name == "pubmed_derived" else ("train",)
  splits = tuple(data_lib.config_value(data_config, "splits", default) or default)
  limit = int(data_lib.config_value(data_config, "max_documents", 0) or 0)
  out = {}
  for split in splits:
    if name == "pubmed_derived":
      rows = data_lib.read_hf_split(root, split, what=name, required_columns=("text",), source=HF_SOURCE)
      texts = [str(r["text"]) for r in rows]
    else:
      rows = data_lib.read_hf_split(root, split, what=name, required_columns=("MedlineCitation",), source=HF_SOURCE)
      texts = [t for t in (_abstract(r) for r in rows) if t]
    out[split] = texts[:limit] if limit > 0 else texts
  return out
