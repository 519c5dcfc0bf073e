"""D2 Pruning's image sets from prepared TFDS folders: CIFAR-10 / CIFAR-100 in memory, ImageNet-1k streamed.

CIFAR comes back as a `common.data.Dataset` in [0, 1] (the coreset scores and selection need every example on
every host). ImageNet comes back as per-host grain shards (`tfds.split_for_jax_process`) of records {'image':
float32 [224, 224, 3], 'label': int32}, with torchvision's eval transform (Resize 256, CenterCrop 224, ImageNet
mean / std), the preprocessing of the official ImageNet evaluation; training augmentation is the trainer's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from iclr24_jax.common import data as data_lib

DATASETS = {
    "cifar10": "TFDS cifar10 (50,000 / 10,000 32x32x3, 10 classes), in memory",
    "cifar100": "TFDS cifar100 (50,000 / 10,000 32x32x3, 100 classes), in memory",
    "imagenet": "TFDS imagenet2012 (1,281,167 train / 50,000 validation, 1,000 classes; manual download of "
                "ILSVRC2012_img_{train,val}.tar), streamed per host",
}
TFDS_NAMES = {"cifar10": "cifar10", "cifar100": "cifar100", "imagenet": "imagenet2012"}


def imagenet_record(record: dict) -> dict:
  """A TFDS imagenet2012 record -> {'image': float32 [224, 224, 3] normalised, 'label': int32 []}."""
  img = data_lib.resize_center_crop(np.asarray(record["image"]), 256, 224)
  return {"image": data_lib.normalize_image(img, data_lib.IMAGENET_MEAN, data_lib.IMAGENET_STD),
          "label": np.int32(record["label"])}


def load(data_config: Any) -> Any:
  """The image set `config.data.name` from the prepared TFDS folder `config.data.data_dir` (or `$ICLR24_DATA/tfds`).

  Args:
    data_config: config.data with `name` (a key of DATASETS), `data_dir`, optionally `val_fraction` (CIFAR;
      default 0.1).

  Returns:
    CIFAR: common.data.Dataset (x float32 [N, 32, 32, 3] in [0, 1], y int32 [N]).
    ImageNet: {'train': grain.MapDataset, 'validation': grain.MapDataset} of this host's records
    (`imagenet_record`).

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: not prepared there.
  """
  name = data_lib.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown D2 Pruning data set '{name}'; choose one of {sorted(DATASETS)} (or the embedded "
                     "'digits', 'mnist5k', 'text').")
  tfds_name = TFDS_NAMES[name]
  how = f"`tfds build {tfds_name} --data_dir=<dir>`" + (
      " after placing ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar in <dir>/downloads/manual"
      if name == "imagenet" else "") + " where there is internet access"
  root = data_lib.locate_data(data_config, "tfds", what=f"TFDS '{tfds_name}'",
                              layout=f"<data_dir>/{tfds_name}/<version>/ (dataset_info.json, *.array_record)",
                              source=how)
  if name != "imagenet":
    return data_lib.tfds_dataset(tfds_name, root, val_fraction=float(data_lib.config_value(data_config,
                                                                                          "val_fraction", 0.1)),
                                 display_name=name)
  import grain
  return {split: grain.MapDataset.source(data_lib.tfds_source(tfds_name, root, split, source=how)).map(imagenet_record)
          for split in ("train", "validation")}
