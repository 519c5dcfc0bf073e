"""DA-CLIP's experiment (`papers/daclip/experiment.py`, slow): a tiny end-to-end run, and a run
crashed inside a restorer stage then resumed equals an uninterrupted one."""
import os

import numpy as np
import pytest


@pytest.mark.slow   # ~70 s CPU: ten small programs to compile (CLIP, controller, embeddings, UNet train, sampling)
def test_experiment_run_tiny(tmp_path):
  """Smoke run of the whole pipeline with the tiny config: files written, numbers in range, paired models."""
  from iclr24_jax.configs import daclip as cfg_mod
  from iclr24_jax.papers.daclip import experiment
  cfg = cfg_mod.get_config("tiny")
  res = experiment.run(cfg, str(tmp_path), progress=False)
  for name in ("results.json", "restorations.png", "psnr_by_degradation.png", "heldout_loss.png",
               "clip/metrics.jsonl", "controller/metrics.jsonl", "controller_s2/metrics.jsonl",
               "restorer_oracle_s1/metrics.jsonl", "restorer_none_s0/checkpoints"):
    assert (tmp_path / name).exists(), name
  assert set(res["accuracy"]) == {"ed_zero_shot", "frozen_zero_shot", "frozen_linear_probe", "content_ec",
                                  "content_frozen"}
  assert len(res["accuracy_items_by_seed"]["ed_zero_shot"]) == cfg.controller.seeds
  rest = res["restoration"]
  assert rest["heldout_steps"] == list(range(1, cfg.num_steps + 1))          # log_every = 1: one point a step
  for c in cfg.conditions:
    loss = rest["heldout_loss"][c]
    assert len(loss["per_seed"]) == cfg.num_seeds and len(loss["per_image"]) == res["num_test"]
    np.testing.assert_allclose(np.mean(loss["per_seed"]), np.mean(loss["per_image"]), rtol=1e-5)
    assert len(rest["single_sample"][c]["psnr"]) == cfg.num_seeds
  assert all(0.0 <= v <= 1.0 for v in res["accuracy"].values())
  assert len(res["accuracy_items"]["ed_zero_shot"]) == res["num_test"] == 7 * cfg.data.test_per_type
  per = res["restoration"]["per_condition"]
  assert set(per) == set(cfg.conditions)
  for c in cfg.conditions:
    assert len(per[c]["psnr"]) == cfg.num_seeds and np.isfinite(per[c]["psnr"]).all()
    assert all(-1.0 <= v <= 1.0 for v in per[c]["ssim"])
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("huge")
  bad = cfg_mod.get_config("tiny")
  bad.restore_conditions = ("daclip", "unconditioned")
  with pytest.raises(ValueError, match="restore_conditions"):
    experiment.run(bad, str(tmp_path / "bad"), progress=False)


def _comparable(tree, workdir: str):
  """results.json's numbers without wall-clock figures (keys ending in '_s' or 'wall_s'), plot paths relative."""
  if isinstance(tree, dict):
    return {k: _comparable(v, workdir) for k, v in tree.items() if not k.endswith("_s")}
  if isinstance(tree, list):
    return [_comparable(v, workdir) for v in tree]
  return tree.replace(workdir, "<workdir>") if isinstance(tree, str) else tree


def _stage_rows(workdir: str) -> dict:
  """Every stage's metrics.jsonl rows (stage folder -> rows without their timing columns)."""
  from iclr24_jax.common import metrics as metrics_lib
  out = {}
  for name in sorted(os.listdir(workdir)):
    path = os.path.join(workdir, name, "metrics.jsonl")
    if os.path.exists(path):
      out[name] = [{k: v for k, v in r.items() if not k.endswith(("_s", "steps_per_s"))}
                   for r in metrics_lib.read_jsonl(path)]
  return out


@pytest.mark.slow   # ~5 min CPU: an uninterrupted tiny run, a run crashed inside a restorer stage, its resume
def test_tiny_crash_inside_a_restorer_stage_then_resume_equals_uninterrupted(tmp_path):
  """Killed without warning (nothing saved at the kill) at step 3 of restorer_daclip_s0, after its step-2
  checkpoint: the launcher's rerun restores the finished stages without training, resumes that stage from step 2,
  and reports the uninterrupted run's results.json numbers and metrics rows exactly."""
  from iclr24_jax.common import checkpoint as ckpt_lib
  from iclr24_jax.configs import daclip as cfg_mod
  from iclr24_jax.launch import run as launch
  cfg = cfg_mod.get_config("tiny")
  every = int(cfg.checkpoint_every)
  assert 0 < every < int(cfg.num_steps) and 0 < every < int(cfg.clip.num_steps)
  full_wd, wd = str(tmp_path / "full"), str(tmp_path / "killed")
  full = launch.run(cfg, full_wd).results

  class Crash(Exception):
    pass

  def crash(step, row):
    if "restorer_daclip_s0/loss" in row and step > every:
      raise Crash(step)

  with pytest.raises(Crash):
    launch.run(cfg, wd, progress_fn=crash)
  assert ckpt_lib.read_status(wd)["status"] == "failed"
  steps = ckpt_lib.checkpoint_steps(wd)
  assert steps[os.path.join("restorer_daclip_s0", "checkpoints")] == every       # saved before the kill
  assert steps[os.path.join("clip", "checkpoints")] == int(cfg.clip.num_steps)    # a finished stage
  assert os.path.join("restorer_daclip_s1", "checkpoints") not in steps          # not reached

  logged = []
  resumed = launch.run(cfg, wd, progress_fn=lambda step, row: logged.append(row)).results
  trained = sorted({k.split("/")[0] for r in logged for k in r if k.endswith("/loss")})
  assert "clip" not in trained and "controller" not in trained and "restorer_none_s0" not in trained
  assert [r["step"] for r in logged if "restorer_daclip_s0/loss" in r] == list(range(every + 1, cfg.num_steps + 1))
  assert _comparable(resumed, wd) == _comparable(full, full_wd)
  assert _stage_rows(wd) == _stage_rows(full_wd)
