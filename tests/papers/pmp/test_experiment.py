"""PMP experiment (`papers/pmp/experiment.py`): a smoke run of the tiny config, 1 vs 8 devices."""
import json
import os

import jax
import numpy as np
import pytest

from iclr24_jax.common import sharding
from iclr24_jax.papers.pmp import train as train_lib


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """The tiny experiment, run once (default mesh: all 8 simulated devices)."""
  from iclr24_jax.configs import pmp as cfg_mod
  from iclr24_jax.papers.pmp import experiment
  cfg = cfg_mod.get_config("tiny")
  workdir = tmp_path_factory.mktemp("pmp_tiny")
  return cfg, workdir, experiment.run(cfg, str(workdir))


def test_tiny_experiment_smoke(tiny_run):
  _, workdir, res = tiny_run
  for f in ("results.json", "metrics.jsonl", "val_curves.png", "test_scores.png"):
    assert os.path.exists(workdir / f), f
  saved = json.load(open(workdir / "results.json"))
  assert set(saved["baselines"]) == {"sage", "gcn"}
  for k in ("auc", "f1_macro", "gmean"):
    assert 0.0 <= res["test"][k] <= 1.0
  assert res["data"]["nodes"] == 300


def test_one_and_eight_devices_agree(tiny_run):
  from iclr24_jax.common.metrics import read_jsonl
  from iclr24_jax.papers.pmp import experiment
  cfg, workdir, res8 = tiny_run
  data = experiment.load_graph(cfg.data, seed=cfg.seed)
  res1 = train_lib.fit(cfg, data, mesh=sharding.make_mesh(devices=jax.devices()[:1]))
  l1 = [r["train/loss"] for r in res1["history"] if "train/loss" in r]
  l8 = [r["train/loss"] for r in read_jsonl(str(workdir / "metrics.jsonl")) if "train/loss" in r]
  assert len(l1) == len(l8) == cfg.num_steps // cfg.log_every
  np.testing.assert_allclose(l1, l8, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(res1["test"]["auc"], res8["test"]["auc"], atol=1e-4)
