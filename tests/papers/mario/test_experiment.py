"""MARIO experiment (`papers/mario/experiment.py`): a smoke run of the tiny config."""
import json
import os

import numpy as np
import pytest


def test_tiny_experiment_smoke(tmp_path):
  from iclr24_jax.configs import mario as cfg_mod
  from iclr24_jax.papers.mario import experiment
  cfg = cfg_mod.get_config("tiny")
  cfg.sft_matched = "pool"                                  # the budget-matched SFT arm trains beside MaRio
  res = experiment.run(cfg, str(tmp_path))
  for arm in ("sft", "mario", "mario_worst", "sft_matched"):
    for n in ("plausibility", "diversity", "consistency", "accuracy"):
      assert np.isfinite(res[arm][n])
  assert res["pool_size"] >= cfg.samples_per_round  # at least the silver rationales
  with open(os.path.join(tmp_path, "results.json")) as f:
    assert json.load(f)["num_eval"] == cfg.data.num_eval
  rows = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
  assert {r["stage"] for r in rows} == {"sft", "quark0", "sft_matched0"}
  # the matched arm takes as many steps as the Quark round: its logged steps mirror quark0's
  assert [r["step"] for r in rows if r["stage"] == "sft_matched0"] == [r["step"] for r in rows
                                                                      if r["stage"] == "quark0"]
  cfg.sft_matched = "later"
  with pytest.raises(ValueError, match="sft_matched"):
    experiment.run(cfg, str(tmp_path / "bad"))
