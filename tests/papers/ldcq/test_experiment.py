"""LDCQ experiment (`papers/ldcq/experiment.py`): a smoke run of the tiny config, and a stage killed then resumed
equals the uninterrupted stage and train_bc's single scan."""
import json
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import ldcq


def test_experiment_run_tiny(tmp_path):
  from iclr24_jax.configs import ldcq as cfg
  from iclr24_jax.papers.ldcq import experiment
  c = cfg.get_config("tiny")
  c.methods = ("ldcq", "random")
  res = experiment.run(c, str(tmp_path))
  saved = json.loads((tmp_path / "results.json").read_text())
  assert set(saved["methods"]) == {"ldcq", "random"}
  assert all(math.isfinite(saved["methods"][m]["score_mean"]) for m in ("ldcq", "random"))
  assert len(saved["sliced_w2_heldout"]["diffusion"]) == 1
  assert all(os.path.exists(p) for p in res["plots"])
  assert sorted(res["checkpoints"]) == ["diffusion", "q_ldcq", "vae"]   # the stages 'ldcq' needs, nothing else
  rows = [json.loads(line) for line in open(tmp_path / "q_ldcq" / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and all(math.isfinite(r["train/loss"]) for r in rows)


class _Crash(Exception):
  """Stands for a process killed without warning (nothing saved at the kill)."""


def test_train_stage_resumes_exactly_and_draws_the_one_scan_stream(tmp_path):
  """The driver of every training stage (`experiment.train_stage`) on the BC stage of 2 seeds, 5 steps in chunks of
  1, saving every 2: killed without a save at step 3 and rerun, it ends where the uninterrupted stage ends, logs the
  same rows, and both equal `train_bc`'s single lax.scan over the same keys (the chunks slice one key stream)."""
  from iclr24_jax.common import loop
  from iclr24_jax.papers.ldcq import experiment
  policy = ldcq.BCPolicy(2, 8)
  rng = np.random.default_rng(0)
  rows = {"obs": jnp.asarray(rng.normal(size=(40, 3)), jnp.float32),
          "act": jnp.asarray(rng.uniform(-1, 1, size=(40, 2)), jnp.float32)}
  seeds = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(2))
  k_init, keys = jax.vmap(lambda k: ldcq.stage_keys(k, 5))(seeds)
  init = jax.vmap(lambda k, r: ldcq.bc_init(k, policy, r["obs"], 1e-2), in_axes=(0, None))
  chunk = jax.jit(jax.vmap(lambda st, ks, r: ldcq.train_steps(
      lambda s, k: ldcq.bc_step(s, k, r["obs"], r["act"], policy=policy, batch_size=8), st, ks), in_axes=(0, 0, None)))
  stages = loop.Stages(str(tmp_path / "cut"), every_steps=2)
  args = ("bc", init, (k_init, rows), chunk, keys, rows, 1)

  def crash(step, row):
    if step == 3:
      raise _Crash(step)

  with loop.observe(crash), pytest.raises(_Crash):
    experiment.train_stage(stages, *args)
  assert sorted(os.listdir(tmp_path / "cut" / "bc" / "checkpoints")) == ["2"]
  resumed, resumed_rows = experiment.train_stage(stages, *args)
  full, full_rows = experiment.train_stage(loop.Stages(str(tmp_path / "full"), every_steps=2), *args)
  assert resumed_rows == full_rows and [r["step"] for r in full_rows] == [1, 2, 3, 4, 5]
  chex.assert_trees_all_equal(resumed.params, full.params)
  one_scan = jax.jit(jax.vmap(lambda k: ldcq.train_bc(k, policy, rows["obs"], rows["act"], num_steps=5, batch_size=8,
                                                      learning_rate=1e-2)[0]))(seeds)
  chex.assert_trees_all_close(full.params, one_scan, rtol=1e-6, atol=1e-7)   # float32, XLA may fuse differently
  again, again_rows = experiment.train_stage(stages, *args)   # a finished stage: restored, nothing trained
  assert again_rows == full_rows
  chex.assert_trees_all_equal(again.params, full.params)
