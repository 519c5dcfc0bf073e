"""MaRio's data sets: StrategyQA, QuaRel and OpenBookQA with GPT-3 silver rationales, as the official repository
ships them (INK-USC/RationaleMultiRewardDistillation, data/<set>/raw/<split>.jsonl: despite the suffix each file is
ONE JSON object keyed "0".."N-1", each value {"question", "rationale", "answer"}).

`load(config.data)` reads every split of the set `config.data.name` names through `common.textdata.load_mario`.
"""
from __future__ import annotations

from typing import Any

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import textdata

DATASETS = {
    "strategyqa": "StrategyQA with silver rationales: strategyqa/raw/{train,dev,test}.jsonl (answers yes / no)",
    "quarel": "QuaRel: quarel/raw/{train,dev,test}.jsonl (answers '(A)' / '(B)'; dev / test rationales 'dummy')",
    "obqa": "OpenBookQA: obqa/raw/{dev,test}.jsonl (answers '(a)'..'(d)'; no silver rationales)",
}
MARIO_SOURCE = "github.com/INK-USC/RationaleMultiRewardDistillation, folder data/ (git clone; data_dir = that folder)"
MARIO_LAYOUT = "<set>/raw/<split>.jsonl for set in strategyqa, quarel, obqa"


def load(data_config: Any) -> dict[str, list[dict]]:
  """Every split of the MaRio question set `config.data.name`.

  Args:
    data_config: config.data with `name` (a key of DATASETS) and `data_dir` (the folder holding <set>/raw/;
      '' = `<shared data>/mario`).

  Returns:
    {split: [item, ...]}, items as `common.textdata.load_mario` gives them: question, rationale, answer,
    has_rationale (False for the 'dummy' placeholder), choices, index.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: the folder or a split file is missing.
  """
  name = data_lib.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown MaRio data set '{name}'; choose one of {sorted(DATASETS)}.")
  root = data_lib.locate_data(data_config, "mario", what=f"MaRio {name}", layout=MARIO_LAYOUT, source=MARIO_SOURCE)
  out = {}
  for split in textdata.MARIO_SPLITS[name]:
    data_lib.need_path(root, [f"{name}/raw/{split}.jsonl"], what=f"MaRio {name}/{split}", layout=MARIO_LAYOUT,
                       source=MARIO_SOURCE)
    out[split] = textdata.load_mario(name, split, data_dir=root)
  return out
