"""MDM's experiment (`papers/mdm/experiment.py`, slow): a smoke run of the tiny config."""
import json
import os

import numpy as np
import pytest


@pytest.mark.slow   # ~60 s CPU on an idle 2-core machine (two train-step compiles, eval, sampler)
def test_experiment_run_tiny(tmp_path):
  from iclr24_jax.papers.mdm import experiment
  from iclr24_jax.configs import mdm as cfg_mod
  cfg = cfg_mod.get_config("tiny")
  res = experiment.run(cfg, str(tmp_path))
  assert res["arm"] == "progressive" and len(res["heldout_eps_mse"]) == 2
  assert np.isfinite(res["final_loss"]) and np.isfinite(res["consistency_mse"])
  with open(os.path.join(tmp_path, "results.json")) as f:
    assert json.load(f)["factor"] == 2
  assert os.path.exists(os.path.join(tmp_path, "samples.png"))
  assert os.path.exists(os.path.join(tmp_path, "inner", "metrics.jsonl"))
  with pytest.raises(ValueError, match="unknown or conflicting"):
    cfg_mod.get_config("tiny,nested,single")
