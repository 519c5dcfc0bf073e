"""NCI experiment (`papers/nci/experiment.py`): a smoke run of the tiny config, the pretrained config."""
import json
import os

import pytest


def test_tiny_run(tmp_path):
  from iclr24_jax.configs import nci as cfg
  from iclr24_jax.papers.nci import experiment
  res = experiment.run(cfg.get_config("tiny"), str(tmp_path))
  assert 0.0 <= res["target_acc"] <= 1.0
  assert os.path.exists(tmp_path / "curves.png")
  assert json.load(open(tmp_path / "results.json"))["method"] == "nci"
  with pytest.raises(ValueError, match="unknown variant"):
    cfg.get_config("huge")


def test_pretrained_config_fine_tunes_at_a_tenth_of_the_lr():
  from iclr24_jax.configs import nci as cfg
  pre, scratch = cfg.get_config("pretrained"), cfg.get_config("reproduce")
  assert pre.optimizer.learning_rate == pytest.approx(0.1 * scratch.optimizer.learning_rate)
  assert pre.data.pool_fraction == 0.25 and scratch.data.pool_fraction == 0.0 and pre.adv_schedule == "ramp"
  assert cfg.get_config("pretrained,tiny").pretrain.steps == 10
