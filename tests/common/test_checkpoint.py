"""Checkpoint / resume: a killed run resumes to the same numbers; broken folders give named errors."""
import os

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from iclr24_jax.common import checkpoint
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.vision import classify
from iclr24_jax.configs import classify as classify_config


def _config(num_steps=10):
  c = classify_config.get_config("tiny")
  c.num_steps = num_steps
  c.checkpoint_every = 5
  c.log_every = 5
  c.eval_every = 0
  return c


@pytest.fixture(scope="module")
def digits():
  from iclr24_jax.common.data import load_digits
  return load_digits()


def test_kill_and_resume_matches_uninterrupted(tmp_path, digits):
  cfg = _config()
  _, full = classify.train_classifier(cfg, digits, workdir=str(tmp_path / "full"), progress=False)
  # "killed" after step 7: the last complete checkpoint is step 5.
  _, part = classify.train_classifier(cfg, digits, workdir=str(tmp_path / "killed"), progress=False, stop_at=7)
  ck = checkpoint.Checkpointer(str(tmp_path / "killed" / "checkpoints"))
  assert ck.latest_step() == 5
  ck.close()
  _, resumed = classify.train_classifier(cfg, digits, workdir=str(tmp_path / "killed"), progress=False)
  assert resumed.start_step == 5
  chex.assert_trees_all_close(jax.device_get(full.state.params), jax.device_get(resumed.state.params), atol=1e-6)
  chex.assert_trees_all_close(jax.device_get(full.state.opt_state), jax.device_get(resumed.state.opt_state),
                              atol=1e-6)
  # metrics.jsonl reads as one run: no rows after the resumed step were duplicated.
  from iclr24_jax.common.metrics import read_jsonl
  steps = [r["step"] for r in read_jsonl(str(tmp_path / "killed" / "metrics.jsonl")) if "train/loss" in r]
  assert steps == sorted(set(steps)) == [5, 10]
  assert os.path.exists(tmp_path / "killed" / "checkpoints" / "config.json")


def _state():
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  return TrainState.create(params, optax.adam(1e-3))


def test_incomplete_save_is_ignored(tmp_path):
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
  ck.save(3, _state())
  # a save killed half-way leaves only orbax's temporary folder behind
  os.makedirs(tmp_path / "ck" / "6.orbax-checkpoint-tmp-1234" / "default")
  assert ck.latest_step() == 3
  restored = ck.restore(jax.eval_shape(_state))
  chex.assert_trees_all_close(restored.params, _state().params)
  ck.close()


def test_corrupt_checkpoint_gives_named_error(tmp_path):
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  ck.save(1, _state())
  ck.close()
  step_dir = tmp_path / "ck" / "1"
  for root, _, files in os.walk(step_dir):
    for f in files:
      with open(os.path.join(root, f), "wb") as fh:
        fh.write(b"garbage")
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint step 1 in .*ck is corrupt"):
    ck.restore(jax.eval_shape(_state))


def test_checkpoint_path_that_is_a_file(tmp_path):
  p = tmp_path / "notadir"
  p.write_text("x")
  with pytest.raises(checkpoint.CheckpointError, match="is not a folder"):
    checkpoint.Checkpointer(str(p))


def test_max_to_keep(tmp_path):
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
  for s in (1, 2, 3):
    ck.save(s, _state())
  assert ck.all_steps() == [2, 3]
  ck.close()
