"""Readers for the text sets beside the project (`../shared/data`, or `$ICLR24_DATA`).

- MaRio's StrategyQA / QuaRel / OpenBookQA (`mario/<set>/raw/<split>.jsonl`): despite the suffix, each file is ONE
  JSON object keyed "0".."N-1", each value {"question", "rationale", "answer"}. QuaRel dev/test and all of
  OpenBookQA carry the placeholder rationale "dummy" (no silver rationale); `has_rationale` says so.
- Anthropic HH-RLHF (`hh_rlhf/<subset>/<split>.jsonl.gz`): one {"chosen", "rejected"} dialogue pair per line.
- LLMBar (`llmbar/Natural/dataset.json`, `llmbar/Adversarial/<subset>/dataset.json`): lists of
  {"input", "output_1", "output_2", "label"}.

Every reader raises FileNotFoundError naming the missing path and the fix (set ICLR24_DATA or pass data_dir).
"""
from __future__ import annotations

import gzip
import json
import os
import pathlib
import re
from typing import Sequence

from iclr24_jax.common import data as data_lib

MARIO_SETS = ("strategyqa", "quarel", "obqa")
MARIO_SPLITS = {"strategyqa": ("train", "dev", "test"), "quarel": ("train", "dev", "test"), "obqa": ("dev", "test")}
LLMBAR_SUBSETS = {"Natural": "Natural", "Neighbor": "Adversarial/Neighbor", "GPTInst": "Adversarial/GPTInst",
                  "GPTOut": "Adversarial/GPTOut", "Manual": "Adversarial/Manual"}
PLACEHOLDER_RATIONALE = "dummy"


def _root(data_dir: str | os.PathLike | None, sub: str) -> pathlib.Path:
  if data_dir not in (None, ""):
    return data_lib.resolve_data_dir(data_dir, "data_dir")
  shared = data_lib.shared_data_dir(required=False)
  if shared is None:
    raise FileNotFoundError(f"the shared data folder (with {sub}/) was not found beside the project; set "
                            f"{data_lib.DATA_ENV}=/path/to/shared/data or pass data_dir=<folder holding {sub}/>.")
  return shared / sub


def _need(path: pathlib.Path, what: str) -> pathlib.Path:
  if not path.is_file():
    raise FileNotFoundError(f"{what}: file {path} not found; set {data_lib.DATA_ENV} to the shared data folder or "
                            "pass data_dir pointing at the folder that holds it.")
  return path


def _split_choices(question: str) -> list[str]:
  """Answer options written inline as '(A) ... (B) ...' (QuaRel) or '(a) ... (b) ...' (OpenBookQA)."""
  parts = re.split(r"\(([A-Da-d])\)\s*", question)
  # parts = [stem, 'A', text_a, 'B', text_b, ...]
  return [parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)] if len(parts) >= 3 else []


def load_mario(dataset: str, split: str, data_dir: str | os.PathLike | None = None) -> list[dict]:
  """Loads one MaRio question set.

  Args:
    dataset: 'strategyqa' (yes/no answers), 'quarel' ('(A)'/'(B)') or 'obqa' ('(a)'..'(d)').
    split: 'train', 'dev' or 'test' (OpenBookQA has no train split).
    data_dir: the `mario` folder (holding <dataset>/raw/); None: `<shared data>/mario`.

  Returns:
    A list (file order, keys "0".."N-1") of dicts: question, rationale, answer, has_rationale (False for the
    "dummy" placeholder), choices (the inline options for QuaRel / OpenBookQA, ['yes', 'no'] for StrategyQA),
    index.
  """
  if dataset not in MARIO_SETS:
    raise ValueError(f"unknown MaRio data set {dataset!r}; choose from {MARIO_SETS}.")
  if split not in MARIO_SPLITS[dataset]:
    raise ValueError(f"{dataset} has splits {MARIO_SPLITS[dataset]}, not {split!r}.")
  path = _need(_root(data_dir, "mario") / dataset / "raw" / f"{split}.jsonl", f"MaRio {dataset}/{split}")
  with open(path) as f:
    obj = json.load(f)
  if not isinstance(obj, dict):
    raise ValueError(f"{path}: expected one JSON object keyed '0'..'N' (MaRio's format), got {type(obj).__name__}.")
  out = []
  for i in range(len(obj)):
    rec = obj.get(str(i))
    if rec is None or not all(k in rec for k in ("question", "rationale", "answer")):
      raise ValueError(f"{path}: record {i} is missing or lacks question/rationale/answer.")
    choices = ["yes", "no"] if dataset == "strategyqa" else _split_choices(rec["question"])
    out.append(dict(question=rec["question"], rationale=rec["rationale"], answer=rec["answer"],
                    has_rationale=rec["rationale"].strip().lower() != PLACEHOLDER_RATIONALE, choices=choices,
                    index=i))
  return out


def load_hh_rlhf(split: str = "test", subset: str = "harmless-base",
                 data_dir: str | os.PathLike | None = None) -> list[dict]:
  """Loads Anthropic HH-RLHF preference pairs.

  Args:
    split: 'test' (the only split beside the project) or 'train' from a user's copy.
    subset: 'harmless-base' (beside the project) or another HH-RLHF folder of a user's copy.
    data_dir: the `hh_rlhf` folder; None: `<shared data>/hh_rlhf`.

  Returns:
    A list of dicts: chosen, rejected (full "\\n\\nHuman: ... \\n\\nAssistant: ..." dialogues), index.
  """
  root = _root(data_dir, "hh_rlhf") / subset
  path = root / f"{split}.jsonl.gz"
  if not path.is_file() and (root / f"{split}.jsonl").is_file():
    path = root / f"{split}.jsonl"
  _need(path, f"HH-RLHF {subset}/{split}")
  opener = gzip.open if path.suffix == ".gz" else open
  out = []
  with opener(path, "rt", encoding="utf-8") as f:
    for i, line in enumerate(f):
      if not line.strip():
        continue
      rec = json.loads(line)
      if "chosen" not in rec or "rejected" not in rec:
        raise ValueError(f"{path}: line {i + 1} lacks 'chosen'/'rejected'.")
      out.append(dict(chosen=rec["chosen"], rejected=rec["rejected"], index=len(out)))
  return out


def split_dialogue(dialogue: str) -> tuple[str, str]:
  """Splits an HH-RLHF dialogue into (history up to the last 'Assistant:', the last assistant reply).

  Args:
    dialogue: "\\n\\nHuman: ...\\n\\nAssistant: ..." text.

  Returns:
    (history, reply); history ends with "Assistant:".
  """
  marker = "\n\nAssistant:"
  pos = dialogue.rfind(marker)
  if pos < 0:
    raise ValueError("dialogue has no '\\n\\nAssistant:' turn; is it an HH-RLHF record?")
  return dialogue[:pos + len(marker)], dialogue[pos + len(marker):].strip()


def load_llmbar(subsets: Sequence[str] | None = None, data_dir: str | os.PathLike | None = None) -> list[dict]:
  """Loads LLMBar pairs (419 in all: Natural 100, Neighbor 134, GPTInst 92, GPTOut 47, Manual 46).

  Args:
    subsets: subset names (default all five, in that order).
    data_dir: the `llmbar` folder; None: `<shared data>/llmbar`.

  Returns:
    A list of dicts: input, output_1, output_2, label (1 or 2: the output that follows the instruction), subset,
    index (position in its subset's file).
  """
  names = list(LLMBAR_SUBSETS) if subsets is None else list(subsets)
  unknown = [n for n in names if n not in LLMBAR_SUBSETS]
  if unknown:
    raise ValueError(f"unknown LLMBar subsets {unknown}; choose from {list(LLMBAR_SUBSETS)}.")
  root = _root(data_dir, "llmbar")
  out = []
  for name in names:
    path = _need(root / LLMBAR_SUBSETS[name] / "dataset.json", f"LLMBar {name}")
    with open(path) as f:
      records = json.load(f)
    for i, rec in enumerate(records):
      if rec.get("label") not in (1, 2) or not all(k in rec for k in ("input", "output_1", "output_2")):
        raise ValueError(f"{path}[{i}]: LLMBar records need input, output_1, output_2 and label 1 or 2.")
      out.append(dict(input=rec["input"], output_1=rec["output_1"], output_2=rec["output_2"],
                      label=int(rec["label"]), subset=name, index=i))
  return out
