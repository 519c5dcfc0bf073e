"""Matryoshka Diffusion's ImageNet: prepared TFDS imagenet2012, streamed per host (grain over
`tfds.split_for_jax_process`), each image centre-cropped to the model's resolution and scaled to [-1, 1].

Preprocessing: guided-diffusion's `center_crop_arr` (box-halving, bicubic resize of the short side, centre
crop), the class-conditional ImageNet pipeline MDM compares with. Labels are the 1,000 ImageNet classes.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from iclr24_jax.common import data as data_lib

DATASETS = {
    "imagenet": "TFDS imagenet2012 (manual download of ILSVRC2012_img_{train,val}.tar), streamed per host; images "
                "centre-cropped to data.image_size (64 / 256 in the paper) and scaled to [-1, 1]",
}
IMAGENET_HOW = ("`tfds build imagenet2012 --data_dir=<dir>` after placing ILSVRC2012_img_train.tar and "
                "ILSVRC2012_img_val.tar in <dir>/downloads/manual")


def imagenet_record(record: dict, image_size: int) -> dict:
  """A TFDS imagenet2012 record -> {'image': float32 [S, S, 3] in [-1, 1], 'label': int32 []}."""
  img = data_lib.center_crop_arr(np.asarray(record["image"]), image_size)
  return {"image": data_lib.to_signed_unit(img), "label": np.int32(record["label"])}


def load(data_config: Any) -> dict:
  """This host's ImageNet records at `config.data.image_size`.

  Args:
    data_config: config.data with `name` 'imagenet', `data_dir` (the TFDS folder; '' = `$ICLR24_DATA/tfds`) and
      `image_size`.

  Returns:
    {'train': grain.MapDataset, 'validation': grain.MapDataset} of `imagenet_record`s (chain .shuffle / .batch).

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: not prepared there.
  """
  import grain
  name = data_lib.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown MDM data set '{name}'; choose one of {sorted(DATASETS)} (or the embedded 'mnist5k', "
                     "'digits').")
  size = int(data_lib.config_value(data_config, "image_size", 64))
  root = data_lib.locate_data(data_config, "tfds", what="TFDS 'imagenet2012'",
                              layout="<data_dir>/imagenet2012/<version>/ (dataset_info.json, *.array_record)",
                              source=IMAGENET_HOW)
  fn = functools.partial(imagenet_record, image_size=size)
  return {split: grain.MapDataset.source(data_lib.tfds_source("imagenet2012", root, split, source=IMAGENET_HOW)).map(fn)
          for split in ("train", "validation")}
