"""FPS's test images: folders of FFHQ 256x256 and ImageNet validation images, as DPS (whose setting FPS
follows) reads them: every image file of the folder in sorted order, scaled to [-1, 1] (ToTensor + Normalize
(0.5, 0.5)), centre-cropped to `data.image_size` with guided-diffusion's `center_crop_arr` (the identity on
images already at that size, e.g. FFHQ 256).
"""
from __future__ import annotations

import functools
from typing import Any

from iclr24_jax.common import data as data_lib

DATASETS = {
    "ffhq": "a folder of FFHQ images (the 1,000 256x256 test images of DPS / FPS: the first 1k of FFHQ's "
            "images256x256 or the thumbnails resized), .png / .jpg",
    "imagenet": "a folder of ImageNet validation images (DPS / FPS: 1,000 images), centre-cropped to image_size",
}
SOURCES = {
    "ffhq": "github.com/NVlabs/ffhq-dataset (download_ffhq.py --images, then resize to 256), or DPS's "
            "data/samples folder (github.com/DPS2022/diffusion-posterior-sampling)",
    "imagenet": "ILSVRC2012 validation images from image-net.org (ILSVRC2012_img_val.tar, unpacked)",
}


def transform(image, image_size: int):
  """uint8 [H, W, 3] -> float32 [S, S, 3] in [-1, 1] (centre crop, then x / 127.5 - 1)."""
  return data_lib.to_signed_unit(data_lib.center_crop_arr(image, image_size))


def load(data_config: Any):
  """This host's images of the folder `config.data.data_dir` (or `$ICLR24_DATA/<name>`).

  Args:
    data_config: config.data with `name` ('ffhq' or 'imagenet'), `data_dir`, `image_size` (default 256) and
      optionally `max_images` (0: all; DPS / FPS evaluate 1,000).

  Returns:
    grain.MapDataset of {'image': float32 [S, S, 3] in [-1, 1], 'path': str}, this JAX process's share
    (records p, p + P, ...) of the sorted file list.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: no folder, or no image in it.
  """
  name = data_lib.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown FPS data set '{name}'; choose one of {sorted(DATASETS)} (or the embedded 'digits').")
  root = data_lib.locate_data(data_config, name, what=f"FPS '{name}' images", layout=DATASETS[name],
                              source=SOURCES[name])
  files = data_lib.list_images(root)
  if not files:
    raise data_lib.DataNotFoundError(f"FPS '{name}': no image files ({', '.join(data_lib.IMAGE_EXTENSIONS)}) under "
                                     f"{root}. Expected layout: {DATASETS[name]}. Get it: {SOURCES[name]}.")
  limit = int(data_lib.config_value(data_config, "max_images", 0) or 0)
  files = files[:limit] if limit > 0 else files
  size = int(data_lib.config_value(data_config, "image_size", 256))
  return data_lib.process_shard(data_lib.ImageFolderSource(files, functools.partial(transform, image_size=size)))
