"""Concept data sets: the paper's synthetic generator and a concept data set built from scikit-learn digits.

A concept data set has, per split, inputs `x` [N, ...], binary concept labels `c` [N, K] and binary targets
`y` [N]. Both generators are deterministic in their seed and need no download.

Synthetic (official `data/synthetic_data.py`, `scripts/generate_synthetic_datasets.py`):
  x ~ Bernoulli(0.7)^5;  c_k = parity(x[idx_k]) with probability 1 - noise_k, else a fair coin, with
  idx = ((0, 1, 3), (0, 1, 2), (0, 1, 4));  y ~ Bernoulli(sigmoid(1 c_0 + 2 c_1 + 3 c_2 - 2));
  60/20/20 train/validation/test split. The official sweep varies the concept noise over 0, 0.05, ..., 0.95.

Digits concepts (ours; the paper's real data sets, CUB / derm7pt / ..., are not available offline): eight
concepts computed from the 8x8 scikit-learn digit images themselves (ink = pixel >= 0.5), and the target
"the digit is even". See `DIGITS_CONCEPTS` for the definitions.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Sequence

import numpy as np

SYNTHETIC_PARITY_INDICES = ((0, 1, 3), (0, 1, 2), (0, 1, 4))
SYNTHETIC_COEFS = (1.0, 2.0, 3.0)
SYNTHETIC_INTERCEPT = -2.0

DIGITS_CONCEPTS = (
    ("loop_top", "an enclosed hole (background not reachable from the border) centred in rows 0-3"),
    ("loop_bottom", "an enclosed hole centred in rows 4-7"),
    ("stroke_right", "a vertical run of >= 5 ink pixels in one of the columns 4-7"),
    ("stroke_left", "a vertical run of >= 5 ink pixels in one of the columns 0-3"),
    ("bar_top", "a horizontal run of >= 4 ink pixels in row 0 or 1"),
    ("bar_bottom", "a horizontal run of >= 4 ink pixels in row 6 or 7"),
    ("ink_low", "more ink mass in rows 4-7 than in rows 0-3"),
    ("ink_left", "more ink mass in columns 0-3 than in columns 4-7"),
)


@dataclasses.dataclass(frozen=True)
class ConceptSplit:
  x: np.ndarray                       # [N, ...] float32 inputs
  c: np.ndarray                       # [N, K] float32 binary concept labels
  y: np.ndarray                       # [N] int32 binary targets
  c_prob: np.ndarray | None = None    # [N, K] true Pr(c_k = 1 | x) when known (synthetic)

  def __len__(self) -> int:
    return int(self.x.shape[0])


@dataclasses.dataclass(frozen=True)
class ConceptDataset:
  name: str
  train: ConceptSplit
  val: ConceptSplit
  test: ConceptSplit
  concept_names: tuple[str, ...]

  @property
  def num_concepts(self) -> int:
    return len(self.concept_names)

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.train.x.shape[1:])


def _split(n: int, fractions: Sequence[float], rng: np.random.Generator) -> list[np.ndarray]:
  if len(fractions) != 3 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
    raise ValueError(f"split fractions {tuple(fractions)} must be 3 positive numbers summing to 1, "
                     "e.g. (0.6, 0.2, 0.2).")
  perm = rng.permutation(n)
  n_train, n_val = int(fractions[0] * n), int(fractions[1] * n)
  return [perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]]


def synthetic_concept_probs(x: np.ndarray, concept_noise: Sequence[float],
                            parity_indices: Sequence[Sequence[int]] = SYNTHETIC_PARITY_INDICES) -> np.ndarray:
  """True Pr(c_k = 1 | x) of the synthetic generator.

  Args:
    x: [N, D] binary features.
    concept_noise: [K] probability that concept k is a fair coin instead of the parity.
    parity_indices: K index tuples into the D features.

  Returns:
    [N, K] float32: noise_k / 2 + (1 - noise_k) * parity(x[idx_k]).
  """
  x = np.asarray(x)
  cols = []
  for noise, idx in zip(concept_noise, parity_indices):
    if max(idx) >= x.shape[1]:
      raise ValueError(f"parity index {max(idx)} is out of range for {x.shape[1]} features.")
    parity = x[:, list(idx)].sum(1) % 2
    cols.append(0.5 * noise + (1.0 - noise) * parity)
  return np.stack(cols, 1).astype(np.float32)


def make_synthetic(num_samples: int = 100_000, seed: int = 0, concept_noise: Sequence[float] = (0.3, 0.3, 0.3),
                   x_prob: float = 0.7, num_features: int = 5,
                   parity_indices: Sequence[Sequence[int]] = SYNTHETIC_PARITY_INDICES,
                   coefs: Sequence[float] = SYNTHETIC_COEFS, intercept: float = SYNTHETIC_INTERCEPT,
                   split: Sequence[float] = (0.6, 0.2, 0.2)) -> ConceptDataset:
  """The paper's synthetic concept data set (noisy parities of feature triples, logistic target).

  Args:
    num_samples: total rows before the split (official default 100,000).
    seed: numpy seed.
    concept_noise: [K] per-concept noise probabilities in [0, 1].
    x_prob: Pr(x_j = 1).
    num_features: D.
    parity_indices: K tuples of feature indices.
    coefs, intercept: the logistic model of y given the true concepts.
    split: train/validation/test fractions.

  Returns:
    ConceptDataset with x [N, D], c [N, K], y [N] and the true concept probabilities c_prob.
  """
  k = len(concept_noise)
  if not (len(parity_indices) == len(coefs) == k):
    raise ValueError(f"concept_noise ({k}), parity_indices ({len(parity_indices)}) and coefs ({len(coefs)}) "
                     "must have one entry per concept.")
  if any(not 0.0 <= p <= 1.0 for p in concept_noise) or not 0.0 <= x_prob <= 1.0:
    raise ValueError(f"concept_noise {tuple(concept_noise)} and x_prob {x_prob} must lie in [0, 1].")
  if num_samples < 10:
    raise ValueError(f"num_samples={num_samples} is too small; use at least 10.")
  rng = np.random.default_rng(seed)
  x = (rng.random((num_samples, num_features)) < x_prob).astype(np.float32)
  c_prob = synthetic_concept_probs(x, concept_noise, parity_indices)
  c = (rng.random(c_prob.shape) < c_prob).astype(np.float32)
  y_prob = 1.0 / (1.0 + np.exp(-(c @ np.asarray(coefs, np.float32) + intercept)))
  y = (rng.random(num_samples) < y_prob).astype(np.int32)
  parts = _split(num_samples, split, rng)
  splits = [ConceptSplit(x[i], c[i], y[i], c_prob[i]) for i in parts]
  return ConceptDataset("synthetic", *splits, concept_names=tuple(f"c{j}" for j in range(k)))


def _longest_run(mask: np.ndarray, axis: int) -> np.ndarray:
  """Longest run of True along `axis` for each line: [N, H, W] -> [N, W] (axis=1) or [N, H] (axis=2)."""
  m = np.moveaxis(mask, axis, -1).astype(np.int32)
  run = np.zeros(m.shape[:-1], np.int32)
  best = np.zeros(m.shape[:-1], np.int32)
  for t in range(m.shape[-1]):
    run = (run + 1) * m[..., t]
    best = np.maximum(best, run)
  return best


def digit_concepts(images: np.ndarray, ink_threshold: float = 0.5) -> np.ndarray:
  """Computes the eight `DIGITS_CONCEPTS` from 8x8 digit images.

  Args:
    images: [N, 8, 8] or [N, 8, 8, 1] intensities in [0, 1].
    ink_threshold: a pixel is ink when its intensity is >= this.

  Returns:
    [N, 8] float32 binary concept labels in the order of `DIGITS_CONCEPTS`.
  """
  from scipy import ndimage
  img = np.asarray(images, np.float32)
  if img.ndim == 4 and img.shape[-1] == 1:
    img = img[..., 0]
  if img.ndim != 3 or img.shape[1:] != (8, 8):
    raise ValueError(f"digit_concepts expects [N, 8, 8] images, got shape {images.shape}.")
  ink = img >= ink_threshold
  loop_top = np.zeros(len(img), bool)
  loop_bottom = np.zeros(len(img), bool)
  for i, b in enumerate(ink):
    holes = ndimage.binary_fill_holes(b) & ~b          # background enclosed by ink
    labels, n = ndimage.label(holes)
    for j in range(1, n + 1):
      centre_row = np.nonzero(labels == j)[0].mean()
      if centre_row < 3.5:
        loop_top[i] = True
      else:
        loop_bottom[i] = True
  vertical = _longest_run(ink, axis=1)      # [N, 8] longest run down each column
  horizontal = _longest_run(ink, axis=2)    # [N, 8] longest run along each row
  stroke_right = vertical[:, 4:].max(1) >= 5
  stroke_left = vertical[:, :4].max(1) >= 5
  bar_top = horizontal[:, :2].max(1) >= 4
  bar_bottom = horizontal[:, 6:].max(1) >= 4
  ink_low = img[:, 4:].sum((1, 2)) > img[:, :4].sum((1, 2))
  ink_left = img[:, :, :4].sum((1, 2)) > img[:, :, 4:].sum((1, 2))
  out = np.stack([loop_top, loop_bottom, stroke_right, stroke_left, bar_top, bar_bottom, ink_low, ink_left], 1)
  return out.astype(np.float32)


def make_digits_concepts(seed: int = 0, split: Sequence[float] = (0.6, 0.2, 0.2),
                         target: str = "even") -> ConceptDataset:
  """A real concept data set from scikit-learn digits (1,797 images, 8 image-derived concepts).

  Args:
    seed: seed of the train/validation/test permutation.
    split: fractions.
    target: 'even' (y = digit is even; default) or 'ge5' (y = digit >= 5).

  Returns:
    ConceptDataset with x [N, 8, 8, 1] in [0, 1], c [N, 8], y [N].
  """
  from sklearn.datasets import load_digits
  d = load_digits()
  x = (d.images / 16.0).astype(np.float32)[..., None]
  if target == "even":
    y = (d.target % 2 == 0).astype(np.int32)
  elif target == "ge5":
    y = (d.target >= 5).astype(np.int32)
  else:
    raise ValueError(f"unknown digits target '{target}'; choose 'even' or 'ge5'.")
  c = digit_concepts(x)
  parts = _split(len(x), split, np.random.default_rng(seed))
  splits = [ConceptSplit(x[i], c[i], y[i]) for i in parts]
  return ConceptDataset(f"digits_{target}", *splits, concept_names=tuple(n for n, _ in DIGITS_CONCEPTS))


def load_concept_dataset(data_config) -> ConceptDataset:
  """Builds the data set named by `config.data` ('synthetic' or 'digits')."""
  name = data_config.get("name", "synthetic")
  if name == "synthetic":
    return make_synthetic(num_samples=int(data_config.get("num_samples", 100_000)),
                          seed=int(data_config.get("seed", 0)),
                          concept_noise=tuple(data_config.get("concept_noise", (0.3, 0.3, 0.3))))
  if name == "digits":
    return make_digits_concepts(seed=int(data_config.get("seed", 0)), target=data_config.get("target", "even"))
  raise ValueError(f"unknown data.name '{name}' for safeguards; choose 'synthetic' or 'digits'.")


# ----------------------------------------------------------------------------------------------------------
# CUB-200-2011 with the concept-bottleneck preprocessing (the official code reads the CBM's processed CUB).

DATASETS = {
    "cub": "CUB-200-2011 as Caltech ships it (CUB_200_2011/): images.txt, image_class_labels.txt, "
           "train_test_split.txt, attributes/image_attribute_labels.txt, images/<class>/<file>.jpg",
}
CUB_SOURCE = ("CUB_200_2011.tgz from the Caltech-UCSD Birds page (data.caltech.edu/records/65de6-vp158), "
              "unpacked; data_dir = the folder holding CUB_200_2011/ (or CUB_200_2011 itself)")


@dataclasses.dataclass(frozen=True)
class CubSplit:
  """One CUB split: image paths, concept labels and classes.

  Attributes:
    paths: N image paths.
    c: [N, K] float32 binary concepts (class-level after majority voting, as the CBM preprocessing).
    y: [N] int32 targets (class 0..199, or 0 / 1 with target 'binary').
    image_ids: [N] int32 CUB image ids.
  """
  paths: tuple[str, ...]
  c: np.ndarray
  y: np.ndarray
  image_ids: np.ndarray

  def __len__(self) -> int:
    return len(self.paths)

  def source(self, transform=None):
    """The split's images as a random-access source of {'image', 'path', 'label'} (common.data.ImageFolderSource)."""
    from iclr24_jax.common import data as common_data
    return common_data.ImageFolderSource([pathlib.Path(p) for p in self.paths], transform, labels=self.y)


def _int_table(path: pathlib.Path, cols: int) -> np.ndarray:
  rows = []
  with open(path) as f:
    for line in f:
      parts = line.split()
      if parts:
        rows.append([int(v) for v in parts[:cols]])   # a few attribute lines carry an extra field: keep the first
  return np.asarray(rows, np.int64).reshape(-1, cols)


def load_cub(root: str | os.PathLike, min_classes: int = 10, val_fraction: float = 0.2, seed: int = 1,
             target: str = "class") -> dict:
  """CUB-200-2011 concepts with the concept-bottleneck (Koh et al. 2020) preprocessing.

  Concepts: the 312 binary attributes, denoised by class-level majority voting (an attribute is 1 for every
  image of a class when at least half that class's images have it), keeping the attributes that are 1 in at
  least `min_classes` classes (112 with the default 10, the CBM's set). Split: the official
  train_test_split.txt gives train / test; `val_fraction` of train becomes val (CBM: 20%, seeded).

  Args:
    root: the CUB_200_2011 folder (or its parent).
    min_classes: the class-count filter.
    val_fraction: share of the official train split held out as val.
    seed: the val draw.
    target: 'class' (200 classes, 0..199) or 'binary' (class id >= 100; the official `reduce_to_binary`).

  Returns:
    {'train', 'val', 'test': CubSplit, 'concept_names': K names, 'num_classes': 200 or 2}.

  Raises:
    common.data.DataNotFoundError: a CUB file is missing. common.data.DataFormatError: the tables disagree.
  """
  from iclr24_jax.common import data as common_data
  root = pathlib.Path(root)
  if (root / "CUB_200_2011").is_dir():
    root = root / "CUB_200_2011"
  need = lambda rel: common_data.need_path(root, [rel], what=f"CUB {rel}", layout=DATASETS["cub"], source=CUB_SOURCE)
  if target not in ("class", "binary"):
    raise ValueError(f"target must be 'class' or 'binary', got {target!r}.")
  with open(need("images.txt")) as f:
    paths = {int(a): b for a, b in (line.split(maxsplit=1) for line in f if line.strip())}
  labels = dict(map(tuple, _int_table(need("image_class_labels.txt"), 2)))
  is_train = dict(map(tuple, _int_table(need("train_test_split.txt"), 2)))
  att = _int_table(need("attributes/image_attribute_labels.txt"), 3)   # image_id, attribute_id, is_present
  ids = np.asarray(sorted(paths), np.int64)
  if set(labels) != set(paths) or set(is_train) != set(paths):
    raise common_data.DataFormatError(f"CUB tables under {root} list different image ids.")
  num_att = int(att[:, 1].max())
  pos = {int(i): k for k, i in enumerate(ids)}
  present = np.zeros((len(ids), num_att), np.float32)
  present[[pos[int(i)] for i in att[:, 0]], att[:, 1] - 1] = att[:, 2]
  y = np.asarray([labels[int(i)] - 1 for i in ids], np.int32)
  if y.min() < 0 or y.max() >= 200:
    raise common_data.DataFormatError("CUB image_class_labels.txt must hold classes 1..200.")
  class_level = np.stack([present[y == k].mean(0) >= 0.5 if np.any(y == k) else np.zeros(num_att, bool)
                          for k in range(200)])                      # [200, 312] majority vote
  keep = np.flatnonzero(class_level.sum(0) >= min_classes)
  concepts = class_level[y][:, keep].astype(np.float32)
  names = [f"attribute_{a + 1}" for a in keep]
  for cand in (root / "attributes" / "attributes.txt", root.parent / "attributes.txt", root / "attributes.txt"):
    if cand.is_file():
      table = dict(line.split(maxsplit=1) for line in cand.read_text().splitlines() if line.strip())
      names = [table.get(str(a + 1), names[j]).strip() for j, a in enumerate(keep)]
      break
  tgt = (y >= 100).astype(np.int32) if target == "binary" else y
  train = np.flatnonzero([is_train[int(i)] == 1 for i in ids])
  test = np.flatnonzero([is_train[int(i)] == 0 for i in ids])
  rng = np.random.default_rng(seed)
  perm = rng.permutation(train)
  n_val = int(round(val_fraction * len(train)))
  parts = {"train": np.sort(perm[n_val:]), "val": np.sort(perm[:n_val]), "test": test}

  def make(idx):
    return CubSplit(tuple(str(root / "images" / paths[int(ids[i])].strip()) for i in idx), concepts[idx], tgt[idx],
                    ids[idx].astype(np.int32))

  return {**{k: make(v) for k, v in parts.items()}, "concept_names": tuple(names),
          "num_classes": 2 if target == "binary" else 200}


def load(data_config) -> Any:
  """The data set `config.data.name` names: 'cub' from `config.data.data_dir` (or `$ICLR24_DATA/cub`), or the
  embedded 'synthetic' / 'digits' (`load_concept_dataset`).

  Args:
    data_config: config.data; for 'cub' optionally `min_classes` (10), `val_fraction` (0.2), `split_seed` (1) and
      `cub_target` ('class' or 'binary').

  Returns:
    'cub': the dict of `load_cub`; otherwise a ConceptDataset.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: CUB files missing.
  """
  from iclr24_jax.common import data as common_data
  name = common_data.config_value(data_config, "name", "synthetic")
  if name in ("synthetic", "digits"):
    return load_concept_dataset(data_config)
  if name not in DATASETS:
    raise ValueError(f"unknown safeguards data set '{name}'; choose one of {sorted(DATASETS)}, 'synthetic', 'digits'.")
  root = common_data.locate_data(data_config, "cub", what="CUB-200-2011", layout=DATASETS["cub"], source=CUB_SOURCE)
  get = lambda k, d: common_data.config_value(data_config, k, d)
  return load_cub(root, min_classes=int(get("min_classes", 10)), val_fraction=float(get("val_fraction", 0.2)),
                  seed=int(get("split_seed", 1)), target=str(get("cub_target", "class")))
