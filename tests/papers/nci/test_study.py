"""NCI study (`papers/nci/study.py`): the pretrained reproduction, fast (slow test)."""
import os

import pytest

from iclr24_jax.configs import nci as nci_config


@pytest.mark.slow
def test_reproduce_pretrained_fast(tmp_path):
  from iclr24_jax.papers.nci import study
  rows = study.reproduce_pretrained(str(tmp_path), fast=True, get_config=nci_config.get_config)
  assert len(rows) == 1 + 4 + 1 + 1
  assert all(r["holds"] is None for r in rows)
  assert rows[0]["ours"].startswith("checkpoint ")
  assert os.path.exists(tmp_path / "lodo.png")  # results/plots/nci_pretrained_lodo.png in a full run
