"""LLMBar experiment (`papers/llmbar/experiment.py`): config variants and a smoke run of the tiny config."""
import os

import pytest

from iclr24_jax.papers import llmbar


def test_config_variants():
  from iclr24_jax.configs import llmbar as cfg_mod
  assert cfg_mod.get_config().strategy == "vanilla" and cfg_mod.get_config().model.name == "smollm2"
  for name in cfg_mod.STRATEGIES:
    assert cfg_mod.get_config(name).strategy == name
    assert name in llmbar.STRATEGIES
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("gpt4")


def test_experiment_run_tiny(tmp_path, shared_data):
  from iclr24_jax.configs import llmbar as cfg_mod
  from iclr24_jax.papers.llmbar import experiment
  cfg = cfg_mod.get_config("tiny")
  cfg.data.data_dir = str(shared_data / "llmbar")
  res = experiment.run(cfg, str(tmp_path))
  assert res["n"] == 10 and 0.0 <= res["accuracy"] <= 1.0 and res["num_generations"] == 20
  assert set(res["subsets"]) == {"Natural", "Neighbor", "GPTInst", "GPTOut", "Manual", "Adversarial"}
  assert os.path.exists(tmp_path / "results.json") and os.path.exists(res["plot"])
  again = experiment.run(cfg, str(tmp_path))  # resumes entirely from the cache
  assert again["cache_hits"] == 20 and again["accuracy"] == res["accuracy"]
