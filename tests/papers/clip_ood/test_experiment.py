"""CLIP OOD experiment (`papers/clip_ood/experiment.py`): config variants and a smoke run of the tiny config."""
import json
import os

import pytest

from iclr24_jax.papers.clip_ood import data as data_mod


def test_config_variants():
  from iclr24_jax.configs import clip_ood as cfg_mod
  for v in cfg_mod.VARIANTS:
    c = cfg_mod.get_config(v)
    assert c.paper == "clip_ood"
  assert cfg_mod.get_config("prune_sketch").prune.benchmarks == ("sketch",)
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("laion5b")


def test_tiny_experiment_smoke(tmp_path):
  from iclr24_jax.configs import clip_ood as cfg_mod
  from iclr24_jax.papers.clip_ood import experiment
  cfg = cfg_mod.get_config("tiny")
  with cfg.unlocked():
    cfg.progress = False
  res = experiment.run(cfg, str(tmp_path))
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert set(saved["zero_shot"]) == set(cfg.conditions)
  for cond in cfg.conditions:
    assert set(data_mod.BENCHMARKS) <= set(saved["zero_shot"][cond])
  sizes = res["splits"]["sizes"]
  assert sizes["random"] == sizes["pruned"] < sizes["full"]
  assert sizes["most_similar"] == sizes["least_similar"] == round(0.5 * sizes["full"])
  for row in res["splits"]["per_benchmark"].values():      # the similarity gap holds after pruning
    assert row["max_excess/pruned"] <= 1e-6 and row["share_closer_than_reference/pruned"] == 0.0
  assert res["contamination_kept"]["pruned"] == 0
  assert os.path.exists(tmp_path / "metrics.jsonl")
  for p in res["plots"]:
    assert os.path.exists(p)
