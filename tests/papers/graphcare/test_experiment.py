"""GraphCare experiment (`papers/graphcare/experiment.py`): a smoke run of the tiny config, the official-run
config."""
import json

import numpy as np


def test_run_tiny_smoke(tmp_path):
  from iclr24_jax.configs import graphcare as cfg_mod
  from iclr24_jax.papers.graphcare import experiment
  cfg = cfg_mod.get_config("tiny")
  cfg.num_steps, cfg.checkpoint_every, cfg.model.num_layers = 6, 6, 1
  res = experiment.run(cfg, str(tmp_path))
  assert np.isfinite(res["test"]["auroc"]) and res["data"]["num_samples"] == 240
  saved = json.loads((tmp_path / "results.json").read_text())
  assert "test_ci95" in saved and (tmp_path / "metrics.jsonl").exists() and (tmp_path / "curves.png").exists()


def test_official_run_config():
  from iclr24_jax.configs import graphcare as cfg_mod
  c = cfg_mod.get_config("repro,official_run")
  assert c.model.match_official_code and not c.model.use_alpha and not c.model.use_beta
  assert cfg_mod.get_config("official_graph").data.graph_construction == "official"
  c = cfg_mod.get_config("gat_rel")
  assert c.model.name == "gat" and c.model.edge_types
