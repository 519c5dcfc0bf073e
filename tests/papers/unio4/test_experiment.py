"""Uni-O4 experiment (`papers/unio4/experiment.py`, `train.py`): config variants and clear errors, a smoke run
of the tiny config, kills inside stages then resume equal the uninterrupted run. The tiny run is one fixture here
so the default run computes it once."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import unio4
from .helpers import _const_policy_params


def test_config_variants_and_errors():
  from iclr24_jax.configs import unio4 as cfg_mod
  c = cfg_mod.get_config("")
  assert c.paper == "unio4" and c.data.name == "brax/inverted_pendulum" and c.data.kind == "medium"
  assert c.bc.num_policies == 4 and c.bc.alpha == 0.1 and c.improve.clip_eps == 0.25 and c.improve.omega == 0.7
  assert cfg_mod.get_config("hopper_medium").data.name == "brax/hopper"
  assert cfg_mod.get_config("inverted_pendulum_medium_replay").data.kind == "medium-replay"
  assert cfg_mod.get_config("random").data.kind == "random"
  assert cfg_mod.get_config("online").online.compare_scratch
  assert c.improve.replace_rule == "best" and c.improve.paired_z == 2.0
  r, f, t = cfg_mod.get_config("reproduce"), cfg_mod.get_config("reproduce_fast"), cfg_mod.get_config("tiny")
  assert r.study.seeds == 3 and r.num_steps == 1000 and r.model.hidden == (256, 256) and r.online.compare_scratch
  # the fast reproduction is the tiny sizes with a few more steps
  assert f.model.hidden == t.model.hidden and f.dynamics.hidden == t.dynamics.hidden and f.num_steps == 40
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("walker")
  with pytest.raises(ValueError, match="critic.mode"):
    unio4.fit_value_functions(jax.random.key(0), None, {"mode": "td3"})
  with pytest.raises(ValueError, match=r"\[B, D\]"):
    unio4.ensemble_bc_loss(_const_policy_params([0.0], [-1.0]), {"obs": jnp.zeros((2,)), "actions": jnp.zeros((2,))},
                           0.1)


def _tiny_config(full: bool, replace_rule: str = "best"):
  from iclr24_jax.configs import unio4 as cfg_mod
  cfg = cfg_mod.get_config("tiny")
  cfg.improve.replace_rule = replace_rule
  cfg.progress = False
  if not full:  # the brax programs (evaluation ~10 s, PPO ~15 s of CPU to compile) run in the slow test below
    cfg.online.num_steps = 0
    cfg.eval_episodes = 0
  return cfg


def _stage_rows(workdir) -> dict:
  """stage -> its metrics.jsonl rows."""
  return {st: [json.loads(line) for line in open(os.path.join(workdir, st, "metrics.jsonl"))]
          for st in ("critic", "dynamics", "bc", "improve", "online") if os.path.exists(os.path.join(workdir, st,
                                                                                                   "metrics.jsonl"))}


def _run_tiny(tmp_path, full: bool, replace_rule: str = "best"):
  from iclr24_jax.papers.unio4 import experiment
  cfg = _tiny_config(full, replace_rule)
  out = experiment.run(cfg, str(tmp_path))
  assert os.path.exists(tmp_path / "results.json")
  res = json.load(open(tmp_path / "results.json"))
  assert len(res["last_ope"]) == cfg.bc.num_policies and np.all(np.isfinite(res["last_ope"]))
  assert 0 <= res["selected"] < cfg.bc.num_policies
  assert os.path.isdir(out["checkpoints"]["improve"]) and os.path.isdir(out["checkpoints"]["critic"])
  stages = set(_stage_rows(tmp_path))
  assert {"critic", "dynamics", "bc", "improve"} <= stages
  return cfg, res, stages


@pytest.fixture(scope="module")
def tiny_paired(tmp_path_factory):
  wd = tmp_path_factory.mktemp("unio4_tiny")
  return wd, _run_tiny(wd, full=False, replace_rule="paired")


def test_experiment_run_tiny(tiny_paired):
  wd, _ = tiny_paired
  checks = _stage_rows(wd)["improve"]
  assert [r["step"] for r in checks] == [0, 10, 20]   # the step-0 OPE, then every improve.eval_every steps
  assert all(len(r["paired_diff"]) == 4 and np.all(np.asarray(r["paired_se"]) >= 0) for r in checks[1:])


class _Crash(Exception):
  """Stands for a process killed without warning (nothing saved at the kill)."""


def test_kills_inside_stages_then_resume_equal_the_uninterrupted_run(tiny_paired, tmp_path):
  """Stopped three times: a real SIGTERM in the critic stage at step 20 (saved there, Preempted, exit code 143);
  killed without a save in the dynamics stage after its step-20 checkpoint (early-stopping state in the loop state's
  extra) and in the improvement stage after its step-10 checkpoint (the gate's best OPE scores and behaviour
  policies in the state); every rerun skips the finished stages and resumes inside the one it was in. The results
  and every stage's metrics.jsonl equal the uninterrupted run's, bit for bit (same programs)."""
  import signal
  from iclr24_jax.common import loop
  from iclr24_jax.papers.unio4 import experiment
  full_wd, (_, full, _) = tiny_paired
  cfg = _tiny_config(False, "paired")
  cfg.checkpoint_every = 10   # improve (eval_every 10) saves at 10; critic / dynamics / BC chunks end at 20, 40
  wd = str(tmp_path / "killed")

  def kill_at(stage_key, step, how):
    def fn(s, row):
      if s == step and stage_key in row:
        if how == "sigterm":
          os.kill(os.getpid(), signal.SIGTERM)   # the real signal, seen by the stage's loop at this boundary
        else:
          raise _Crash(s)
    return fn

  with loop.observe(kill_at("v_loss", 20, "sigterm")), pytest.raises(loop.Preempted) as stopped:
    experiment.run(cfg, wd)
  assert stopped.value.step == 20 and stopped.value.exit_code == 143 and loop.stop_requested() is None
  assert stopped.value.where == os.path.join(wd, "critic", "checkpoints")
  for stage_key, step in (("holdout_mse", 40), ("ope", 20)):
    with loop.observe(kill_at(stage_key, step, "crash")), pytest.raises(_Crash):
      experiment.run(cfg, wd)
  assert sorted(os.listdir(os.path.join(wd, "improve", "checkpoints"))) == ["10", "config.json"]
  resumed = experiment.run(cfg, wd)
  drop = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "wall_seconds", "checkpoints", "plots")}
  assert drop(json.load(open(os.path.join(wd, "results.json")))) == drop(full)
  assert resumed["best_ope"] == full["best_ope"] and resumed["replacements"] == full["replacements"]
  assert _stage_rows(wd) == _stage_rows(full_wd)


@pytest.mark.slow
def test_experiment_run_tiny_with_evaluation_and_online(tmp_path):
  cfg, res, stages = _run_tiny(tmp_path, full=True)
  assert os.path.exists(tmp_path / "offline_curves.png") and os.path.exists(tmp_path / "online_curves.png")
  assert len(res["unio4_return"]) == cfg.bc.num_policies and np.isfinite(res["unio4_score_mean"])
  assert len(res["online_eval_return"]) == cfg.online.num_steps + 1
  assert "online" in stages
