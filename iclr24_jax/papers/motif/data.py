"""Motif's NetHack data set of annotated observation pairs, in the official layout (facebookresearch/motif,
`motif_dataset/` after unzipping `motif_dataset_zipped`; read by rlaif/dataset.py `PairsDataset`):

  motif_dataset/data/message.npy          uint8 [N, 2, T, 256]: the two observations' NetHack messages (T = 1)
  motif_dataset/data/<blstats|tty_chars|tty_colors>.npy   the rest of each observation (not read here)
  motif_dataset/preference/<annotator>.npy int8 [N]: 0 first preferred, 1 second, 2 tie, 3 unknown (skipped)

Annotators are named llama{7,13,70}b_msg_{defaultgoal,zeroknowledge,combat,gold,stairs}_{default,reworded};
the paper's main runs use llama70b_msg_defaultgoal_default.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import numpy as np

from iclr24_jax.common import data as data_lib

# rlaif/llms.py AnnotationIdx
FIRST, SECOND, TIE, UNKNOWN = 0, 1, 2, 3
DATASETS = {
    "motif_dataset": "the official Motif pairs: data/message.npy (uint8 [N, 2, T, 256]) and "
                     "preference/<annotator>.npy (int8 [N], 0 / 1 / 2 / 3 = first / second / tie / unknown)",
}
DATASET_ALIASES = {"motif": "motif_dataset", "nethack_pairs": "motif_dataset"}
DATASETS.update({alias: f"alias of '{name}'" for alias, name in DATASET_ALIASES.items()})
DEFAULT_ANNOTATOR = "llama70b_msg_defaultgoal_default"
SOURCE = ("github.com/facebookresearch/motif: `cat motif_dataset_zipped/motif_dataset_part_* > motif_dataset.zip; "
          "unzip motif_dataset.zip` (data_dir = the motif_dataset folder)")


def decode_message(row: np.ndarray) -> str:
  """A NetHack message buffer (uint8 [256], zero padded) as text: the characters of its non-zero bytes
  (rlaif/annotators_transforms.py MessageTransform)."""
  return "".join(chr(c) for c in np.asarray(row).ravel() if c != 0)


def preference_targets(preferences: np.ndarray) -> np.ndarray:
  """Annotations -> the reward model's cross-entropy targets [N, 2]: first (1, 0), second (0, 1), tie (0.5, 0.5).

  Raises:
    ValueError: a value outside {0, 1, 2} (unknown pairs must be dropped first).
  """
  p = np.asarray(preferences)
  if p.size and (p.min() < 0 or p.max() > TIE):
    raise ValueError("preferences must be 0 (first), 1 (second) or 2 (tie); drop unknown (3) pairs first.")
  out = np.zeros(p.shape + (2,), np.float32)
  out[p == FIRST, 0] = 1.0
  out[p == SECOND, 1] = 1.0
  out[p == TIE] = 0.5
  return out


@dataclasses.dataclass(frozen=True)
class MotifPairs:
  """The annotated pairs (memory-mapped messages) of one annotator.

  Attributes:
    messages: uint8 [N, 2, T, 256] (memory-mapped; T = 1 in the released data).
    preferences: int8 [N] annotations.
    valid: int64 [M] indices of the annotated pairs (preference != UNKNOWN), as PairsDataset keeps.
    annotator: the annotation file's name.
  """
  messages: np.ndarray
  preferences: np.ndarray
  valid: np.ndarray
  annotator: str

  def __len__(self) -> int:
    return int(len(self.valid))

  def captions(self, i: int) -> tuple[str, str]:
    """The two captions (last message of each sub-episode) of the i-th valid pair."""
    pair = np.asarray(self.messages[int(self.valid[int(i)])])
    pair = pair.reshape(2, -1, pair.shape[-1])
    return decode_message(pair[0, -1]), decode_message(pair[1, -1])

  def split(self, train_fraction: float = 0.8, seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """A random train / val split of the valid pairs (positions into `valid`).

    Deviation: the official 80 / 20 split is torch's random_split with generator seed 42; this is a numpy
    permutation with the same share, so the rows differ.
    """
    perm = np.random.default_rng(seed).permutation(len(self.valid))
    n_tr = int(train_fraction * len(perm))
    return np.sort(perm[:n_tr]), np.sort(perm[n_tr:])


def load(data_config: Any) -> MotifPairs:
  """The pairs and one annotator's preferences from `config.data.data_dir` (or `$ICLR24_DATA/motif_dataset`).

  Args:
    data_config: config.data with `name` ('motif_dataset' or an alias), `data_dir` and optionally `annotator`
      (default llama70b_msg_defaultgoal_default).

  Returns:
    MotifPairs.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: a file is missing.
    common.data.DataFormatError: message.npy is not uint8 [N, 2, (T,) 256], or the annotation's length differs.
  """
  name = data_lib.config_value(data_config, "name")
  name = DATASET_ALIASES.get(name, name)
  if name not in DATASETS:
    raise ValueError(f"unknown Motif data set '{name}'; choose one of {sorted(DATASETS)} (or the embedded "
                     "'toy_captions', 'nethack_messages').")
  annotator = str(data_lib.config_value(data_config, "annotator", "") or DEFAULT_ANNOTATOR)
  root = pathlib.Path(data_lib.locate_data(data_config, "motif_dataset", what="the Motif data set",
                                           layout=DATASETS[name], source=SOURCE))
  msg_path = data_lib.need_path(root, ["data/message.npy"], what="Motif messages", layout=DATASETS[name],
                                source=SOURCE)
  pref_path = data_lib.need_path(root, [f"preference/{annotator}.npy"], what=f"Motif annotations '{annotator}'",
                                 layout=DATASETS[name], source=SOURCE)
  messages = np.load(msg_path, mmap_mode="r")
  prefs = np.load(pref_path, mmap_mode="r")
  if messages.dtype != np.uint8 or messages.ndim not in (3, 4) or messages.shape[1] != 2 or messages.shape[-1] != 256:
    raise data_lib.DataFormatError(f"{msg_path}: expected uint8 [N, 2, T, 256] NetHack messages, got "
                                   f"{messages.dtype} {messages.shape}.")
  if prefs.ndim != 1 or prefs.shape[0] != messages.shape[0]:
    raise data_lib.DataFormatError(f"{pref_path}: expected [N] = [{messages.shape[0]}] annotations, got {prefs.shape}.")
  prefs = np.asarray(prefs, np.int8)
  if prefs.size and (prefs.min() < FIRST or prefs.max() > UNKNOWN):
    raise data_lib.DataFormatError(f"{pref_path}: annotations must lie in 0..3 (first, second, tie, unknown).")
  return MotifPairs(messages, prefs, np.flatnonzero(prefs != UNKNOWN), annotator)
