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


@pytest.mark.slow
def test_tiny_run_cut_inside_the_agents_stage_resumes_exactly(tmp_path):
  """A crash (no save at the kill) at the agents' last update, after their saves at updates 1 and 2: the resume
  restores the stacked RunnerStates of update 2 and reports the uninterrupted run's numbers and rows."""
  from iclr24_jax.common import checkpoint as ckpt_lib
  from iclr24_jax.configs import motif as cfg_mod
  from iclr24_jax.launch import run as launch
  from tests.launch.helpers import _Crash, _comparable, _rows
  c = cfg_mod.get_config("tiny")
  full = launch.run(c, str(tmp_path / "full")).results

  def crash_in_agents(step, row):
    if any(k.startswith("train/") for k in row):
      raise _Crash(step)

  wd = str(tmp_path / "killed")
  with pytest.raises(_Crash):
    launch.run(c, wd, progress_fn=crash_in_agents)
  steps = ckpt_lib.checkpoint_steps(wd)
  assert steps == {os.path.join("reward_model", "checkpoints"): 20, os.path.join("agents", "checkpoints"): 2}, steps
  resumed = launch.run(c, wd).results
  assert _comparable(resumed, wd) == _comparable(full, str(tmp_path / "full"))
  assert _rows(wd) == _rows(str(tmp_path / "full"))


@pytest.mark.slow
def test_tiny_nethack_run_cut_inside_an_agent_stage_resumes_exactly(tmp_path):
  """NetHack: a crash (no save at the kill) at the second agent's last update, after its saves at updates 1 and 2,
  with 12-step episodes so the saved games are mid-episode after an auto-reset: the resume replays the games,
  restores the hook's counts and cache, and reports the uninterrupted run's numbers and rows."""
  pytest.importorskip("nle")
  from iclr24_jax.common import checkpoint as ckpt_lib
  from iclr24_jax.configs import motif as cfg_mod
  from iclr24_jax.launch import run as launch
  from tests.launch.helpers import _Crash, _comparable, _rows
  c = cfg_mod.get_config("tiny,nethack")
  c.nethack.update(dict(updates=3, checkpoint_every=1, max_episode_steps=12))   # 3 x 8 steps: resets at 12, 24
  full = launch.run(c, str(tmp_path / "full")).results
  assert any(r["episode_returns"] for r in full["runs"].values())   # episodes ended inside the run
  agent_rows = []

  def crash_in_second_agent(step, row):
    if "hook/intrinsic_reward" in row:
      agent_rows.append(step)
      if len(agent_rows) == 6:          # extrinsic 1, 2, 3; intrinsic 1, 2, then the kill at intrinsic 3
        raise _Crash(step)

  wd = str(tmp_path / "killed")
  with pytest.raises(_Crash):
    launch.run(c, wd, progress_fn=crash_in_second_agent)
  steps = ckpt_lib.checkpoint_steps(wd)
  assert steps == {os.path.join("reward_model", "checkpoints"): 20, os.path.join("agents_extrinsic", "checkpoints"): 3,
                   os.path.join("agents_intrinsic", "checkpoints"): 2}, steps
  resumed = launch.run(c, wd).results
  assert _comparable(resumed, wd) == _comparable(full, str(tmp_path / "full"))
  assert _rows(wd) == _rows(str(tmp_path / "full"))
  assert launch.run(c, wd).stored      # a finished workdir is a result: nothing trains
