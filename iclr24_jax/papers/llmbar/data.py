"""LLMBar data: 419 (instruction, output_1, output_2, label) instances in five subsets.

Layout (princeton-nlp/LLMBar, Dataset/LLMBar/): Natural/dataset.json and Adversarial/{Neighbor, GPTInst, GPTOut,
Manual}/dataset.json, each a JSON list of {"input", "output_1", "output_2", "label"} with label 1 or 2 (the output
that follows the instruction).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Sequence

import numpy as np

from iclr24_jax.common import data as data_lib

# Subset name -> path under the data folder. The paper reports Natural and the mean of the four adversarial
# subsets ("Adversarial").
SUBSETS = {
    "Natural": "Natural",
    "Neighbor": "Adversarial/Neighbor",
    "GPTInst": "Adversarial/GPTInst",
    "GPTOut": "Adversarial/GPTOut",
    "Manual": "Adversarial/Manual",
}
ADVERSARIAL = ("Neighbor", "GPTInst", "GPTOut", "Manual")
SUBSET_SIZES = {"Natural": 100, "Neighbor": 134, "GPTInst": 92, "GPTOut": 47, "Manual": 46}


@dataclasses.dataclass(frozen=True)
class Instance:
  """One LLMBar pair.

  Attributes:
    input: the instruction.
    output_1: the first candidate output.
    output_2: the second candidate output.
    label: 1 or 2, the output that better follows the instruction.
    subset: subset name ('Natural', 'Neighbor', 'GPTInst', 'GPTOut', 'Manual' or '' for user data).
    index: position within its subset's file.
  """

  input: str
  output_1: str
  output_2: str
  label: int
  subset: str = ""
  index: int = -1

  @property
  def uid(self) -> str:
    return f"{self.subset}/{self.index}"


def default_data_dir() -> pathlib.Path:
  """`<shared data>/llmbar` (ICLR24_DATA overrides the shared folder); raises naming the fix when absent."""
  root = data_lib.shared_data_dir(required=True)
  return root / "llmbar"


def _check_record(rec: dict, where: str) -> None:
  missing = [k for k in ("input", "output_1", "output_2", "label") if k not in rec]
  if missing:
    raise ValueError(f"{where}: record lacks fields {missing}; LLMBar records need input, output_1, output_2, label.")
  if rec["label"] not in (1, 2):
    raise ValueError(f"{where}: label must be 1 or 2, got {rec['label']!r}.")


DATASETS = {
    "llmbar": "LLMBar (princeton-nlp/LLMBar, Dataset/LLMBar/): Natural/dataset.json and "
              "Adversarial/{Neighbor,GPTInst,GPTOut,Manual}/dataset.json, JSON lists of {input, output_1, "
              "output_2, label in {1, 2}}; 419 pairs",
}
LLMBAR_SOURCE = "github.com/princeton-nlp/LLMBar, folder Dataset/LLMBar/ (git clone, then point data_dir there)"
LLMBAR_LAYOUT = "Natural/dataset.json and Adversarial/<Neighbor|GPTInst|GPTOut|Manual>/dataset.json"


def load(data_dir: Any = None, subsets: Sequence[str] | None = None) -> dict[str, list[Instance]]:
  """Loads LLMBar.

  Args:
    data_dir: config.data (with `name` 'llmbar', `data_dir` and optionally `subsets`), or the folder holding
      Natural/ and Adversarial/ (None or '': `<shared data>/llmbar`).
    subsets: names to load (default: config.data.subsets when given, else all five, in SUBSETS order).

  Returns:
    {subset name: [Instance, ...]} (Natural 100, Neighbor 134, GPTInst 92, GPTOut 47, Manual 46).

  Raises:
    common.data.DataNotFoundError: the folder or a subset file is missing (the message gives the layout and the
      source). ValueError: an unknown subset, or a record without the four fields / with a label not 1 or 2.
  """
  config = None
  if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
    config = data_dir
    name = data_lib.config_value(config, "name", "llmbar")
    if name not in DATASETS:
      raise ValueError(f"unknown LLMBar data set '{name}'; choose one of {sorted(DATASETS)}.")
    if subsets is None:
      subsets = list(data_lib.config_value(config, "subsets", ()) or ()) or None
  root = data_lib.locate_data(config if config is not None else {"data_dir": data_dir or ""}, "llmbar",
                              what="LLMBar", layout=LLMBAR_LAYOUT, source=LLMBAR_SOURCE)
  names = list(SUBSETS) if subsets is None else list(subsets)
  unknown = [n for n in names if n not in SUBSETS]
  if unknown:
    raise ValueError(f"unknown LLMBar subsets {unknown}; choose from {list(SUBSETS)}.")
  out = {}
  for name in names:
    path = data_lib.need_path(pathlib.Path(root), [f"{SUBSETS[name]}/dataset.json"], what=f"LLMBar {name}",
                              layout=LLMBAR_LAYOUT, source=LLMBAR_SOURCE)
    with open(path) as f:
      records = json.load(f)
    items = []
    for i, rec in enumerate(records):
      _check_record(rec, f"{path}[{i}]")
      items.append(Instance(input=rec["input"], output_1=rec["output_1"], output_2=rec["output_2"],
                            label=int(rec["label"]), subset=name, index=i))
    out[name] = items
  return out


def stratified_subset(data: dict[str, list[Instance]], per_subset: int | None, seed: int = 0
                      ) -> dict[str, list[Instance]]:
  """A fixed random sample of `per_subset` instances from every subset (all when None or larger).

  The draw uses `np.random.default_rng(seed)` per subset (seed folded with the subset's position), keeps the
  file order of the chosen instances, and does not look at lengths or labels, so it is an unbiased sample.

  Args:
    data: the output of `load`.
    per_subset: instances per subset (None or <= 0: everything).
    seed: sampling seed.

  Returns:
    {subset: [Instance, ...]}.
  """
  if per_subset is None or per_subset <= 0:
    return {k: list(v) for k, v in data.items()}
  out = {}
  for j, (name, items) in enumerate(data.items()):
    if per_subset >= len(items):
      out[name] = list(items)
      continue
    rng = np.random.default_rng([seed, j])
    chosen = np.sort(rng.choice(len(items), size=per_subset, replace=False))
    out[name] = [items[int(i)] for i in chosen]
  return out
