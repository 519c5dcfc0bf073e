"""Preference pairs for CPM: HH-RLHF (harmless-base test) from the shared data folder, and a synthetic generator
whose true feature weights and true reward are known.

The official code reads the pairs with features already attached (dongyoung4091/hh-rlhf_with_features_*) and
puts the chosen reply in position A or B at random (`preprocess_hh_dataset`: label 1 = A is chosen); the same
is done here with a seeded generator.
"""
from __future__ import annotations

import pathlib
import re
from typing import Sequence

import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import textdata
from iclr24_jax.papers.cpm import features as feat

_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):", re.S)


def load_pairs(num_pairs: int, seed: int = 0, max_chars: int = 600, data_dir: str | None = None,
               skip: int = 0) -> list[dict]:
  """HH-RLHF harmless-base test pairs as (history, reply A, reply B, label).

  Pairs are kept when both replies are non-empty and different, chosen and rejected share the history, and
  both transcripts have at most `max_chars` characters; they are shuffled with `seed` and `num_pairs` are
  taken after the first `skip`. Each pair's chosen reply goes to A or B by a fair coin (official).

  Args:
    num_pairs: pairs to return.
    seed: shuffling and A/B-order seed.
    max_chars: longest transcript kept (the LM cost grows with the prompt length).
    data_dir: the HH-RLHF folder (holding harmless-base/) or the shared data folder above it (default:
      ICLR24_DATA or ../shared/data).
    skip: pairs skipped first (so disjoint sets can be drawn from one shuffle).

  Returns:
    A list of {'history', 'reply_a', 'reply_b', 'label' (1: A is chosen), 'index' (row in the file)}.
  """
  import os
  from iclr24_jax.common import textdata
  if data_dir and os.path.isdir(os.path.join(data_dir, "hh_rlhf")):
    data_dir = os.path.join(data_dir, "hh_rlhf")
  rows = textdata.load_hh_rlhf(split="test", subset="harmless-base", data_dir=data_dir)
  keep = []
  for i, r in enumerate(rows):
    if len(r["chosen"]) > max_chars or len(r["rejected"]) > max_chars:
      continue
    h1, c = feat.split_dialogue(r["chosen"])
    h2, j = feat.split_dialogue(r["rejected"])
    if h1 != h2 or not c or not j or c == j:
      continue
    keep.append((i, h1, c, j))
  rng = np.random.default_rng(seed)
  order = rng.permutation(len(keep))
  if skip + num_pairs > len(keep):
    raise ValueError(f"asked for {num_pairs} pairs after {skip}, but only {len(keep)} HH-RLHF pairs have "
                     f"transcripts <= {max_chars} characters; raise max_chars or ask for fewer.")
  flips = rng.random(len(keep)) < 0.5
  out = []
  for k in order[skip:skip + num_pairs]:
    i, h, c, j = keep[k]
    a_is_chosen = bool(flips[k])
    out.append({"history": h, "reply_a": c if a_is_chosen else j, "reply_b": j if a_is_chosen else c,
                "label": int(a_is_chosen), "index": int(i)})
  return out


def history_messages(history: str) -> list[dict[str, str]]:
  """An HH transcript ("Human: ... \\n\\nAssistant: ... \\n\\nHuman: ...") as chat messages.

  Args:
    history: the transcript before the reply.

  Returns:
    [{'role': 'user' | 'assistant', 'content'}, ...].
  """
  text = "\n\n" + history.strip()
  parts = _TURN.split(text)
  msgs = []
  for role, content in zip(parts[1::2], parts[2::2]):
    msgs.append({"role": "user" if role == "Human" else "assistant", "content": content.strip()})
  if not msgs:
    raise ValueError(f"no Human/Assistant turns in the history: {history[:80]!r}.")
  return msgs


def make_synthetic(seed: int, num_pairs: int, weights: Sequence[float] | np.ndarray,
                   embed_dim: int = 0, embed_noise: float = 1.0, feature_corr: float = 0.3) -> dict:
  """Pairs whose labels come from a known Bradley-Terry reward on features (and, optionally, an embedding).

  Features of each reply: 1 + 9 * sigmoid of correlated Gaussians (scores in (1, 10) like the LM's expected
  scores); the true reward R*(y) = weights . z(f(y)) with z standardising by the generator's known
  population moments; label ~ Bernoulli(sigmoid(R*(A) - R*(B))). The embedding (for a standard-PM stand-in)
  mixes the features linearly into `embed_dim` dimensions plus Gaussian noise.

  Args:
    seed: generator seed.
    num_pairs: N pairs.
    weights: [F] true weights on standardised features.
    embed_dim: D (0: no embedding).
    embed_noise: noise std of the embedding.
    feature_corr: correlation between any two latent feature Gaussians.

  Returns:
    {'fa', 'fb': [N, F], 'labels': [N], 'reward_a', 'reward_b': [N] true rewards, 'weights': [F],
      'ea', 'eb': [N, D] (if embed_dim)}. Draw train and test pairs in one call and split them, so both share
      the embedding's projection.
  """
  w = np.asarray(weights, np.float64)
  f = w.shape[0]
  rng = np.random.default_rng(seed)
  cov = np.full((f, f), feature_corr) + (1 - feature_corr) * np.eye(f)
  chol = np.linalg.cholesky(cov)

  def draw(n):
    g = rng.normal(size=(n, f)) @ chol.T
    return 1.0 + 9.0 / (1.0 + np.exp(-g)), g

  fa, ga = draw(num_pairs)
  fb, gb = draw(num_pairs)
  # z(f) through the known latent Gaussian (monotone in f): the true reward is linear in it.
  ra, rb = ga @ w, gb @ w
  labels = (rng.random(num_pairs) < 1.0 / (1.0 + np.exp(-(ra - rb)))).astype(np.int32)
  out = {"fa": fa, "fb": fb, "labels": labels, "reward_a": ra, "reward_b": rb, "weights": w}
  if embed_dim:
    proj = rng.normal(size=(f, embed_dim)) / np.sqrt(f)
    out["ea"] = ga @ proj + embed_noise * rng.normal(size=(num_pairs, embed_dim))
    out["eb"] = gb @ proj + embed_noise * rng.normal(size=(num_pairs, embed_dim))
  return out


# ----------------------------------------------------------------------------------------------------------
# The paper's preference sets in their published layouts.

DATASETS = {
    "hh_rlhf": "Anthropic HH-RLHF: <subset>/{train,test}.jsonl.gz (subsets harmless-base, helpful-base, "
               "helpful-online, helpful-rejection-sampled), one {chosen, rejected} dialogue pair per line",
    "shp": "Stanford Human Preferences (SHP): <domain>/{train,validation,test}.json, JSON lines with history, "
           "human_ref_A, human_ref_B, labels (1: A preferred)",
}
HH_SOURCE = "github.com/anthropics/hh-rlhf (git clone; data_dir = the clone, holding harmless-base/ etc.)"
SHP_SOURCE = "the stanfordnlp/SHP data set (git clone of its hub repository; data_dir = the clone, holding <domain>/)"


def _hh_records(root, split: str, subsets) -> list[dict]:
  root = pathlib.Path(root)
  names = list(subsets) or sorted(p.name for p in root.iterdir() if p.is_dir())
  out = []
  for sub in names:
    common_data.need_path(root, [f"{sub}/{split}.jsonl.gz", f"{sub}/{split}.jsonl"], what=f"HH-RLHF {sub}/{split}",
                       layout=DATASETS["hh_rlhf"], source=HH_SOURCE)
    for r in textdata.load_hh_rlhf(split=split, subset=sub, data_dir=root):
      h1, c = feat.split_dialogue(r["chosen"])
      h2, j = feat.split_dialogue(r["rejected"])
      if h1 != h2 or not c or not j or c == j:   # not a pair of replies to one history
        continue
      out.append({"history": h1, "chosen": c, "rejected": j, "source": f"{sub}/{r['index']}"})
  return out


def _shp_records(root, split: str, subsets) -> list[dict]:
  root = pathlib.Path(root)
  names = list(subsets) or sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
  out = []
  for sub in names:
    path = common_data.need_path(root, [f"{sub}/{split}.json", f"{sub}/{split}.jsonl"], what=f"SHP {sub}/{split}",
                              layout=DATASETS["shp"], source=SHP_SOURCE)
    for i, r in enumerate(common_data.read_records(path)):
      missing = [k for k in ("history", "human_ref_A", "human_ref_B", "labels") if k not in r]
      if missing:
        raise common_data.DataFormatError(f"{path} record {i} lacks {missing}; SHP records have history, "
                                       "human_ref_A, human_ref_B, labels.")
      a_wins = int(r["labels"]) == 1
      out.append({"history": r["history"], "chosen": r["human_ref_A"] if a_wins else r["human_ref_B"],
                  "rejected": r["human_ref_B"] if a_wins else r["human_ref_A"], "source": f"{sub}/{i}"})
  return out


def load(data_config) -> dict[str, list[dict]]:
  """The train and test preference pairs of HH-RLHF or SHP, from `config.data.data_dir` (or the shared data).

  Args:
    data_config: config.data with `name` ('hh_rlhf' or 'shp'), `data_dir` (the set's folder, or a folder holding
      it; '' = `<shared data>/hh_rlhf`), optionally `subsets` (HH subsets / SHP domains; default every folder
      with JSON files) and `splits` (default ('train', 'test'), or ('test',) when no subset has a train file,
      as the shared copy, which holds only harmless-base test).

  Returns:
    {split: [{'history', 'chosen', 'rejected', 'source'}]}: HH transcripts are split at their last
    '\\n\\nAssistant:' turn (`features.split_dialogue`: the history before it, stripped, and the reply), pairs
    whose histories differ or whose replies are empty or equal are dropped (as `load_pairs`).

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: a split file is missing.
    common.data.DataFormatError: an SHP record lacks its fields.
  """
  name = common_data.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown CPM data set '{name}'; choose one of {sorted(DATASETS)}.")
  subsets = tuple(common_data.config_value(data_config, "subsets", ()) or ())
  source = HH_SOURCE if name == "hh_rlhf" else SHP_SOURCE
  root = common_data.locate_data(data_config, name, what=name, layout=DATASETS[name], source=source)
  if (root / name).is_dir():   # data_dir may be the shared data folder itself (as `load_pairs` accepts)
    root = root / name
  if not subsets:   # every folder holding JSON / JSON-lines files
    subsets = tuple(d.name for d in sorted(root.iterdir()) if d.is_dir() and any(d.glob("*.json*")))
  # The shared copy beside the project holds only HH-RLHF harmless-base test; a user's clone has both splits.
  has_train = any(next((root / sub).glob("train.json*"), None) is not None for sub in subsets)
  default_splits = ("train", "test") if has_train else ("test",)
  splits = tuple(common_data.config_value(data_config, "splits", default_splits) or default_splits)
  read = _hh_records if name == "hh_rlhf" else _shp_records
  return {s: read(root, s, subsets) for s in splits}
