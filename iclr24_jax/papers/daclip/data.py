"""DA-CLIP's universal restoration data in the official folder layout (Algolzw/daclip-uir, MD_dataset.py):
`<root>/<degradation>/LQ/*` and `<root>/<degradation>/GT/*`, one folder per degradation type, LQ and GT paired by
their sorted file order; `<root>` is datasets/universal/train or .../val.

Records are RGB float32 in [0, 1] (the official `read_img` / 255 then BGR -> RGB) plus `lq_clip`, the LQ image
through CLIP's eval transform (the input of DA-CLIP's image encoder). `random_patch` is the official training
crop and flip / rotation augmentation.
"""
from __future__ import annotations

import pathlib
from typing import Any, Sequence

import numpy as np

from iclr24_jax.common import data as data_lib

# train.yml `distortion`: the ten degradation types of the paper, in the official order (type ids 0..9).
DEGRADATIONS = ("motion-blurry", "hazy", "jpeg-compressed", "low-light", "noisy", "raindrop", "rainy", "shadowed",
                "snowy", "uncompleted")
DATASETS = {
    "universal": "the paper's 10-degradation mixture: <split>/<degradation>/{LQ,GT}/ image folders for the ten "
                 f"types {DEGRADATIONS}, data_dir = the folder holding train/ and val/",
}
DATASET_ALIASES = {"daclip": "universal", "universal_ir": "universal"}
DATASETS.update({alias: f"alias of '{name}'" for alias, name in DATASET_ALIASES.items()})
SOURCE = ("the DA-CLIP README (github.com/Algolzw/daclip-uir, 'Dataset Construction'): collect the ten sets, "
          "then its scripts/generate_universal_dataset / prepare scripts write datasets/universal/{train,val}/"
          "<degradation>/{LQ,GT}")


class PairSource:
  """Random-access (grain-compatible) LQ / GT pairs of several degradation folders.

  Record i: {'lq', 'gt': float32 [H, W, 3] in [0, 1], 'lq_clip': float32 [224, 224, 3] (CLIP-normalised),
  'type': int32 (index into `types`), 'path': the GT path}. Records go round-robin over the types (type i % T
  first), as the official validation order, skipping types whose folder is exhausted.

  Args:
    pairs: per type, a list of (lq_path, gt_path).
    types: the type names, same order as pairs.
    clip_size: side of `lq_clip` (0: leave it out).
  """

  def __init__(self, pairs: Sequence[Sequence[tuple[pathlib.Path, pathlib.Path]]], types: Sequence[str],
               clip_size: int = 224):
    self.types = tuple(types)
    self.clip_size = int(clip_size)
    self.index = []
    longest = max((len(p) for p in pairs), default=0)
    for k in range(longest):
      for t, p in enumerate(pairs):
        if k < len(p):
          self.index.append((t, p[k][0], p[k][1]))

  def __len__(self) -> int:
    return len(self.index)

  def __getitem__(self, i: int) -> dict[str, Any]:
    t, lq_path, gt_path = self.index[int(i)]
    lq, gt = data_lib.read_image(lq_path), data_lib.read_image(gt_path)
    out = {"lq": lq.astype(np.float32) / 255.0, "gt": gt.astype(np.float32) / 255.0, "type": np.int32(t),
           "path": str(gt_path)}
    if self.clip_size:
      out["lq_clip"] = data_lib.clip_preprocess(lq, self.clip_size)
    return out


def random_patch(record: dict, patch_size: int, rng: np.random.Generator, flip: bool = True, rot: bool = True
                 ) -> dict:
  """The official training crop: one random patch_size window of LQ and GT (same place), then a random
  horizontal flip, vertical flip and 90-degree transpose (data/util.py `augment`) applied to both.

  Args:
    record: a PairSource record.
    patch_size: P (256 in train.yml); images smaller than P keep their size.
    rng: numpy Generator.
    flip, rot: use_flip / use_rot.

  Returns:
    the record with 'lq' and 'gt' replaced by [P, P, 3] patches.
  """
  h, w = record["gt"].shape[:2]
  top, left = rng.integers(0, max(0, h - patch_size) + 1), rng.integers(0, max(0, w - patch_size) + 1)
  ops = (flip and rng.random() < 0.5, flip and rng.random() < 0.5, rot and rng.random() < 0.5)

  def aug(x):
    x = x[top:top + patch_size, left:left + patch_size]
    if ops[0]:
      x = x[:, ::-1]
    if ops[1]:
      x = x[::-1]
    if ops[2]:
      x = x.transpose(1, 0, 2)
    return np.ascontiguousarray(x)

  return dict(record, lq=aug(record["lq"]), gt=aug(record["gt"]))


def load(data_config: Any) -> dict[str, Any]:
  """This host's LQ / GT pairs of the universal restoration set, per split.

  Args:
    data_config: config.data with `name` ('universal'), `data_dir` (the folder holding train/ and val/; '' =
      `$ICLR24_DATA/universal`), optionally `degradations` (default the ten DEGRADATIONS), `splits` (default
      ('train', 'val')) and `clip_size` (224).

  Returns:
    {split: grain.MapDataset of PairSource records, this JAX process's share}, plus 'types': the type names.

  Raises:
    ValueError: unknown name or degradation. common.data.DataNotFoundError: a split or LQ / GT folder is missing.
    common.data.DataFormatError: an LQ folder and its GT folder hold different numbers of images.
  """
  name = data_lib.config_value(data_config, "name")
  name = DATASET_ALIASES.get(name, name)
  if name not in DATASETS:
    raise ValueError(f"unknown DA-CLIP data set '{name}'; choose one of {sorted(DATASETS)} (or the embedded "
                     "'mnist5k', 'digits').")
  types = tuple(data_lib.config_value(data_config, "degradations", ()) or DEGRADATIONS)
  unknown = [t for t in types if t not in DEGRADATIONS]
  if unknown:
    raise ValueError(f"unknown degradations {unknown}; choose from {DEGRADATIONS}.")
  splits = tuple(data_lib.config_value(data_config, "splits", ("train", "val")) or ("train", "val"))
  root = data_lib.locate_data(data_config, "universal", what="DA-CLIP universal restoration data",
                              layout=DATASETS[name], source=SOURCE)
  out: dict[str, Any] = {"types": types}
  for split in splits:
    pairs = []
    for t in types:
      folder = {}
      for side in ("LQ", "GT"):
        d = data_lib.need_path(root, [f"{split}/{t}/{side}"], what=f"DA-CLIP {split}/{t}/{side}",
                               layout=DATASETS[name], source=SOURCE)
        folder[side] = data_lib.list_images(d)
      if len(folder["LQ"]) != len(folder["GT"]) or not folder["GT"]:
        raise data_lib.DataFormatError(f"DA-CLIP {split}/{t}: {len(folder['LQ'])} LQ vs {len(folder['GT'])} GT "
                                       "images; the official loader pairs them by sorted order, so the counts "
                                       "must match (and not be 0).")
      pairs.append(list(zip(folder["LQ"], folder["GT"])))
    source = PairSource(pairs, types, int(data_lib.config_value(data_config, "clip_size", 224)))
    out[split] = data_lib.process_shard(source)
  return out
