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


@pytest.mark.slow
def test_tiny_run_cut_inside_a_quark_round_resumes_exactly(tmp_path):
  """A crash (no save at the kill) at Quark round 0's last step, after its save at step 1: the resume restores the
  round's adapters, minibatch cursor, numpy draws and sampled pool and reports the uninterrupted
  run's numbers, rows and samples; the matched-SFT arm resumes after it."""
  from iclr24_jax.common import checkpoint as ckpt_lib
  from iclr24_jax.configs import mario as cfg_mod
  from iclr24_jax.launch import run as launch
  from tests.launch.helpers import _Crash, _comparable, _rows
  cfg = cfg_mod.get_config("tiny")
  cfg.sft_matched = "pool"
  full_wd, wd = str(tmp_path / "full"), str(tmp_path / "killed")
  full = launch.run(cfg, full_wd).results

  def crash_in_quark(step, row):
    if step == 2 and any(k.startswith("quark0/") for k in row):
      raise _Crash(step)

  with pytest.raises(_Crash):
    launch.run(cfg, wd, progress_fn=crash_in_quark)
  assert ckpt_lib.checkpoint_steps(wd) == {os.path.join("sft", "checkpoints"): 2,
                                           os.path.join("quark0", "checkpoints"): 1}
  resumed = launch.run(cfg, wd).results
  assert _comparable(resumed, wd) == _comparable(full, full_wd)
  assert _rows(wd) == _rows(full_wd)
  assert json.load(open(os.path.join(wd, "samples.json"))) == json.load(open(os.path.join(full_wd, "samples.json")))
