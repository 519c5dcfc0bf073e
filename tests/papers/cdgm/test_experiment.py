"""C-DGM experiment (`papers/cdgm/experiment.py`): config variants and a smoke run of the tiny config."""
import pytest


def test_config_variants():
  from iclr24_jax.configs import cdgm as cfg
  assert cfg.get_config().data.name == "generated"
  assert cfg.get_config("heloc").data.name == "heloc"
  o = cfg.get_config("heloc_official")
  assert (o.data.name, o.model.name, o.num_steps, o.model.loss_factor, o.optimizer.tvae.weight_decay) == (
      "heloc", "tvae", 2250, 2.0, 5e-6)
  c = cfg.get_config("faults_ctgan_postprocessing")
  assert (c.data.name, c.model.name, c.model.version) == ("faults", "ctgan", "postprocessing")
  with pytest.raises(ValueError, match="unknown variant"):
    cfg.get_config("nope")


def test_experiment_run_tiny(tmp_path):
  import json
  import os
  from iclr24_jax.configs import cdgm as cfg
  from iclr24_jax.papers.cdgm import experiment
  res = experiment.run(cfg.get_config("tiny"), str(tmp_path))
  assert res["violation_rate"] == 0.0
  for f in ("metrics.jsonl", "results.json", "loss.png", "constraint_pair.png"):
    assert os.path.exists(tmp_path / f), f
  with open(tmp_path / "results.json") as fh:
    assert json.load(fh)["data"] == "generated"
