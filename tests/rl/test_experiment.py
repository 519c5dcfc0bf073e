"""The RL experiment (`rl/experiment.py`): a tiny PPO run, and a run stopped by SIGTERM then
resumed continues the same episodes."""
import json
import os

import numpy as np
import pytest

from iclr24_jax.rl import experiment
from .helpers import _tiny


def _tiny_experiment():
  c = _tiny()
  c.num_steps = 4
  c.log_every, c.eval_every, c.eval_episodes, c.checkpoint_every = 1, 2, 4, 1
  return c


@pytest.fixture(scope="module")
def tiny_experiment(tmp_path_factory):
  wd = tmp_path_factory.mktemp("ppo_tiny")
  return wd, experiment.run(_tiny_experiment(), str(wd))


def test_experiment_run_tiny(tiny_experiment):
  wd, res = tiny_experiment
  c = _tiny_experiment()
  rows = [json.loads(l) for l in open(wd / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2, 3, 4] and "eval/return" in rows[1] and "eval/return" in rows[-1]
  assert res["env_steps"] == 4 * c.ppo.num_envs * c.ppo.rollout_steps
  assert os.path.exists(wd / "results.json") and os.path.exists(wd / "curves.png")
  assert np.isfinite(res["eval_return"]) and res["random_return"] > 0


def test_experiment_sigterm_then_resume_continues_the_same_episodes(tiny_experiment, tmp_path):
  """A real SIGTERM after update 2: the RunnerState (networks, optimizer, the environments mid-episode, the key) is
  saved there and the run stops; the rerun continues those episodes, so its results and metrics.jsonl equal the
  uninterrupted run's bit for bit (the same compiled chunk). A finished workdir then returns its stored numbers."""
  import signal
  from iclr24_jax.common import loop
  full_wd, full = tiny_experiment
  c, wd = _tiny_experiment(), tmp_path / "killed"

  def sigterm(step, row):
    if step == 2:
      os.kill(os.getpid(), signal.SIGTERM)

  with loop.observe(sigterm), pytest.raises(loop.Preempted) as stopped:
    experiment.run(c, str(wd))
  assert stopped.value.step == 2 and stopped.value.exit_code == 143
  assert sorted(os.listdir(wd / "checkpoints"))[:2] == ["1", "2"]
  resumed = experiment.run(c, str(wd))
  assert resumed["resumed_from_update"] == 2
  timing = ("compile_s", "train_s", "save_s", "total_s", "env_steps_per_s", "resumed_from_update")
  same = lambda r: {k: v for k, v in r.items() if k not in timing}  # noqa: E731
  assert same(resumed) == same(full)
  read = lambda d: [json.loads(l) for l in open(d / "metrics.jsonl")]  # noqa: E731
  assert read(wd) == read(full_wd)
  before = (wd / "metrics.jsonl").read_bytes()
  again = experiment.run(c, str(wd))   # finished: restored, nothing trained or logged
  assert same(again) == same(full) and again["resumed_from_update"] == 4
  assert (wd / "metrics.jsonl").read_bytes() == before
