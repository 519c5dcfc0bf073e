"""The diffusion experiment (`diffusion/experiment.py`): the configs, a smoke run, and (slow)
recognisable digits from the study's UNet."""
import json
import os

import numpy as np
import pytest

from iclr24_jax.diffusion import schedules, unet


def test_configs():
  from iclr24_jax.configs import diffusion as cfg_mod
  for v in ("", "tiny", "x16", "v_cosine", "continuous", "unconditional"):
    c = cfg_mod.get_config(v)
    assert c.paper == "diffusion"
    unet.create_model(c.model)
    schedules.from_config(c.schedule)
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("huge")


def test_experiment_smoke_run(tmp_path):
  from iclr24_jax.configs import diffusion as cfg_mod
  from iclr24_jax.diffusion import experiment, study
  cfg = cfg_mod.get_config("tiny")
  res = {**experiment.run(cfg, str(tmp_path)), **study.judge_run(str(tmp_path), cfg)}
  for f in ("metrics.jsonl", "results.json", "samples.npz", "samples.png", "data.png", "loss.png"):
    assert os.path.exists(tmp_path / f), f
  with open(tmp_path / "results.json") as fh:
    saved = json.load(fh)
  assert saved["num_steps"] == 20 and np.isfinite(saved["final_loss"])
  assert 0.0 <= res["samples_accuracy"] <= 1.0


@pytest.mark.slow
def test_digits_unet_learns_recognisable_samples(tmp_path):
  """The default config: the loss falls and the digits CNN recognises the requested digit above chance.

  With n = 200 samples, chance accuracy 0.1 has binomial SE sqrt(0.1 * 0.9 / 200) = 0.021; we require 3 SE above.
  """
  from iclr24_jax.configs import diffusion as cfg_mod
  from iclr24_jax.diffusion import experiment, study
  cfg = cfg_mod.get_config("")
  res = {**experiment.run(cfg, str(tmp_path)), **study.judge_run(str(tmp_path), cfg)}
  assert res["final_loss"] < 0.7 * res["first_loss"], res
  n = cfg.sampler.num_samples
  assert res["samples_accuracy"] > 0.1 + 3 * np.sqrt(0.09 / n), res
