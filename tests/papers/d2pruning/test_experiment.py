"""D2 Pruning experiment (`papers/d2pruning/experiment.py`): coreset training (1 vs 8 devices, shared keys), a
smoke run of the tiny config, config variants."""
import os

import jax
import numpy as np

from .helpers import _tiny_cfg


def test_coreset_training_same_on_1_and_8_devices(digits_small):
  from iclr24_jax.common import sharding
  from iclr24_jax.papers.d2pruning import experiment
  cfg = _tiny_cfg()
  cfg.num_steps = 10
  coresets = [np.arange(i * 50, i * 50 + 100) for i in range(8)]
  one = experiment.train_coresets(cfg, digits_small, coresets, jax.random.key(0),
                                  mesh=sharding.make_mesh(devices=jax.devices()[:1]))
  eight = experiment.train_coresets(cfg, digits_small, coresets, jax.random.key(0),
                                    mesh=sharding.make_mesh(devices=jax.devices()[:8]))
  np.testing.assert_allclose(one["final_loss"], eight["final_loss"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(one["test_accuracy"], eight["test_accuracy"], atol=1e-6)


def test_coreset_runs_with_the_same_seed_share_the_training_key(digits_small):
  from iclr24_jax.common import sharding
  from iclr24_jax.papers.d2pruning import experiment
  cfg = _tiny_cfg()
  cfg.num_steps = 5
  same = [np.arange(200)] * 4
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  out = experiment.train_coresets(cfg, digits_small, same, jax.random.key(0), mesh=mesh, seeds=[0, 1, 0, 1])
  np.testing.assert_allclose(out["final_loss"][0], out["final_loss"][2], rtol=1e-6)  # paired by seed: identical
  assert out["final_loss"][0] != out["final_loss"][1]  # another seed: another initialisation


def test_experiment_tiny_run(tmp_path):
  from iclr24_jax.papers.d2pruning import experiment
  res = experiment.run(_tiny_cfg(), str(tmp_path))
  assert set(res["accuracy"]) == {"d2", "d2_nofwd", "random", "ccs", "kcenter", "difficulty"}
  assert set(res["accuracy"]["d2"]) == {"0.5", "0.9"}
  assert os.path.exists(tmp_path / "results.json")
  for stage in ("scores", "coresets"):   # each stage resumes in its own folder
    assert os.path.exists(tmp_path / stage / "metrics.jsonl")
  for p in res["plots"]:
    assert os.path.exists(p)
  assert 0.0 <= res["accuracy"]["d2"]["0.5"]["mean"] <= 1.0
  assert set(res["d2_gamma_reverse_chosen"]) == {"0.5", "0.9"}


def test_config_variants():
  from iclr24_jax.configs import d2pruning as cfg_mod
  for v in cfg_mod.VARIANTS:
    c = cfg_mod.get_config(v)
    assert c.paper == "d2pruning" and len(c.selection.hard_cutoff) == len(c.selection.pruning_rates)
  assert cfg_mod.get_config("mnist5k").data.name == "mnist5k"
