"""Safeguards experiment (`papers/safeguards/experiment.py`): a smoke run of the tiny config."""
import json
import os

import numpy as np

from iclr24_jax.papers.safeguards import experiment


def test_run_tiny(tmp_path):
  from iclr24_jax.configs import safeguards as cfg_mod
  cfg = cfg_mod.get_config("tiny")
  res = experiment.run(cfg, str(tmp_path), progress=False)
  for name in ("results.json", "metrics.jsonl", "coverage_vs_budget.png"):
    assert os.path.exists(tmp_path / name)
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  curve = saved["curve"]
  assert len(curve["variance"]["coverage"]) == len(cfg.safeguard.budget_fractions)
  # budget 0 = the safeguard without confirmation; a full budget confirms every concept of every abstained
  # instance, so both policies coincide there.
  np.testing.assert_allclose(curve["variance"]["coverage"][0], saved["test_at_tau"]["coverage"], rtol=1e-6)
  np.testing.assert_allclose(curve["variance"]["coverage"][-1], curve["random"]["coverage"][-1], rtol=1e-6)
  assert all(c >= curve["variance"]["coverage"][0] - 1e-6 for c in curve["random"]["coverage"])
  assert 0.5 <= res["tau"] <= 1.0 and "selective_x" in saved
  # the global budget: same total confirmations; at a full budget it confirms everything too
  glob = saved["curve_global"]
  assert glob["budget_mode"] == "global"
  np.testing.assert_allclose(glob["variance"]["coverage"][0], curve["variance"]["coverage"][0], rtol=1e-6)
  np.testing.assert_allclose(glob["variance"]["coverage"][-1], curve["variance"]["coverage"][-1], rtol=1e-6)
