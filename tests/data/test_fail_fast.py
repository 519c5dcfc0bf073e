"""Every paper's experiment.run reads the paper's own data set first: pointed at a missing folder it raises
common.data.DataNotFoundError (naming the layout and the source) before any model is built."""
import importlib
import time

import pytest

from iclr24_jax.common import data as common_data
from iclr24_jax.registry import PAPERS

# One of each paper's own data sets (a key of its data module's DATASETS).
PAPER_DATA = {
    "llmbar": "llmbar", "fps": "ffhq", "clip_ood": "imagenet", "finetune_dissect": "pubmed_derived",
    "motif": "motif_dataset", "coboosting": "cifar10", "cpm": "hh_rlhf", "d2pruning": "cifar100",
    "unio4": "hopper-medium-v2", "graphcare": "mimic3", "nci": "pacs", "mdm": "imagenet", "ldcq": "maze2d-large-v1",
    "pmp": "yelpchi", "cdgm": "url", "lm_inversion": "one_million_instructions", "mario": "strategyqa",
    "safeguards": "cub", "daclip": "universal",
}


def test_every_paper_has_a_loader():
  assert set(PAPER_DATA) == set(PAPERS)
  for slug, name in PAPER_DATA.items():
    mod = importlib.import_module(f"iclr24_jax.papers.{slug}.data")
    assert name in mod.DATASETS and callable(mod.load), slug
    assert all(isinstance(v, str) and v for v in mod.DATASETS.values()), slug


@pytest.mark.parametrize("slug", sorted(PAPER_DATA))
def test_run_fails_fast_without_the_data(slug, tmp_path):
  config = importlib.import_module(f"iclr24_jax.configs.{slug}").get_config("tiny")
  config.data.name = PAPER_DATA[slug]
  config.data.data_dir = str(tmp_path / "not_here")
  experiment = importlib.import_module(f"iclr24_jax.papers.{slug}.experiment")
  t0 = time.perf_counter()
  with pytest.raises(common_data.DataNotFoundError, match="not_here"):
    experiment.run(config, str(tmp_path / "workdir"))
  assert time.perf_counter() - t0 < 5.0   # nothing was trained or compiled first
