"""Co-Boosting's image sets as prepared TFDS folders (`tfds build <name> --data_dir=<dir>`), read in memory.

The paper partitions MNIST, Fashion-MNIST, SVHN, CIFAR-10 and CIFAR-100 over clients (Dirichlet) and evaluates
the server on the test split. Images come back in [0, 1] as the library's models take them. Deviation: the
official code normalises with mean 0.5 / std 0.5 (see README.md); `x * 2 - 1` gives that scale.
"""
from __future__ import annotations

from typing import Any

from iclr24_jax.common import data as data_lib

TFDS_NAMES = {"mnist": "mnist", "fashion_mnist": "fashion_mnist", "fmnist": "fashion_mnist", "svhn": "svhn_cropped",
              "cifar10": "cifar10", "cifar100": "cifar100"}
DATASETS = {
    "mnist": "TFDS mnist (60,000 / 10,000 28x28x1, 10 classes)",
    "fashion_mnist": "TFDS fashion_mnist (60,000 / 10,000 28x28x1, 10 classes)",
    "fmnist": "alias of fashion_mnist",
    "svhn": "TFDS svhn_cropped (73,257 / 26,032 32x32x3, 10 classes)",
    "cifar10": "TFDS cifar10 (50,000 / 10,000 32x32x3, 10 classes)",
    "cifar100": "TFDS cifar100 (50,000 / 10,000 32x32x3, 100 fine classes)",
}


def load(data_config: Any) -> data_lib.Dataset:
  """The image set `config.data.name`, from the prepared TFDS folder `config.data.data_dir` (or `$ICLR24_DATA/tfds`).

  Args:
    data_config: config.data with `name` (a key of DATASETS), `data_dir` and optionally `val_fraction`
      (default 0.0: the official code trains the clients on all of train and reports test accuracy).

  Returns:
    common.data.Dataset: x float32 [N, H, W, C] in [0, 1], y int32 [N].

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: not prepared there (the message says how).
  """
  name = data_lib.config_value(data_config, "name")
  if name not in TFDS_NAMES:
    raise ValueError(f"unknown Co-Boosting data set '{name}'; choose one of {sorted(DATASETS)}.")
  tfds_name = TFDS_NAMES[name]
  root = data_lib.locate_data(data_config, "tfds", what=f"TFDS '{tfds_name}'",
                              layout=f"<data_dir>/{tfds_name}/<version>/ (dataset_info.json, *.array_record)",
                              source=f"`tfds build {tfds_name} --data_dir=<dir>` where there is internet access")
  return data_lib.tfds_dataset(tfds_name, root, val_fraction=float(data_lib.config_value(data_config, "val_fraction", 0.0)),
                               display_name=name)
