"""The `lm` experiment: config variants and a smoke run of the tiny config."""
import json
import os

import pytest

from iclr24_jax.configs import lm as cfg_mod
from iclr24_jax import registry


def test_config_variants():
  assert cfg_mod.get_config().paper == "lm"
  assert cfg_mod.get_config().model.name == "smollm2"
  tiny = cfg_mod.get_config("tiny")
  assert tiny.model.name == "tiny_llama" and not tiny.lora.enabled
  assert cfg_mod.get_config("tiny_lora").lora.enabled
  with pytest.raises(ValueError, match="tiny_lora"):
    cfg_mod.get_config("huge")


def test_registered():
  assert registry.exists("lm")
  assert hasattr(registry.experiment_module("lm"), "run")
  study = registry.study_module("lm")
  assert all(hasattr(study, f) for f in ("reproduce", "benchmark"))


def test_tiny_run_writes_results(tmp_path):
  from iclr24_jax.lm import experiment
  cfg = cfg_mod.get_config("tiny_lora")
  with cfg.unlocked():
    cfg.num_steps = 8
    cfg.eval_every = 0
    cfg.checkpoint_every = 0
  res = experiment.run(cfg, str(tmp_path))
  assert res["lora"] and res["eval_loss_after"] < res["eval_loss_before"]
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert saved["num_steps"] == 8 and isinstance(saved["samples"], dict)
  assert os.path.exists(tmp_path / "metrics.jsonl") and os.path.exists(tmp_path / "curves.png")


def test_bad_data_dir(tmp_path):
  from iclr24_jax.lm import experiment
  cfg = cfg_mod.get_config("tiny")
  with cfg.unlocked():
    cfg.data.data_dir = str(tmp_path / "missing")
  with pytest.raises(FileNotFoundError, match="data_dir"):
    experiment.run(cfg, str(tmp_path / "w"))
