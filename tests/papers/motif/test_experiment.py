"""Motif experiment (`papers/motif/experiment.py`): smoke runs of the tiny configs."""
import os

import pytest

from iclr24_jax.papers.motif import experiment


def test_experiment_tiny_run(tmp_path):
  from iclr24_jax.configs import motif as cfg_mod
  c = cfg_mod.get_config("tiny")
  res = experiment.run(c, str(tmp_path))
  assert res["annotator"] == "oracle"
  assert res["agreement_with_oracle"]["agreement"] == 1.0
  assert set(res["agents"]) == {"intrinsic", "extrinsic", "both"}
  for stats in res["agents"].values():
    assert len(stats["success"]) == c.num_seeds and all(0.0 <= s <= 1.0 for s in stats["success"])
  assert os.path.exists(tmp_path / "results.json") and os.path.exists(tmp_path / "toy_success.png")
  assert os.path.exists(tmp_path / "motif_annotations_oracle.jsonl")
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("bogus")


@pytest.mark.slow
def test_experiment_tiny_nethack_run(tmp_path):
  from iclr24_jax.configs import motif as cfg_mod
  res = experiment.run(cfg_mod.get_config("tiny,nethack"), str(tmp_path))
  assert set(res["runs"]) == {"extrinsic", "intrinsic", "both"}
  assert all(r["env_steps"] > 0 and r["steps_per_s"] > 0 for r in res["runs"].values())
