"""D2 Pruning study (`papers/d2pruning/study.py`): the fast reproduction rows (slow test)."""
import pytest

from iclr24_jax.configs import d2pruning as cfg_mod


@pytest.mark.slow
def test_reproduce_fast_rows(tmp_path):
  from iclr24_jax.papers.d2pruning import study
  rows = study.reproduce(str(tmp_path), fast=True, get_config=cfg_mod.get_config)
  assert rows and all({"paper", "experiment", "metric", "ours", "paper_value", "holds"} <= set(r) for r in rows)
