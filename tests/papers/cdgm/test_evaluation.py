"""C-DGM evaluation (`papers/cdgm/evaluation.py`): detection groups."""
import numpy as np
import pytest


def test_detection_groups_split_the_held_out_synthetic_rows():
  from iclr24_jax.papers.cdgm import evaluation
  rng = np.random.default_rng(0)
  real = rng.normal(0, 1, (400, 3))
  # the first half of the synthetic rows is far from the real ones (always detected), the second half is real-like
  synth = np.concatenate([rng.normal(8, 1, (200, 3)), rng.normal(0, 1, (200, 3))])
  far = np.arange(400) < 200
  out = evaluation.detection(real, synth, seed=0, groups={"far": far, "near": ~far})
  assert out["count_far"] + out["count_near"] == 120      # 30% of 400 synthetic rows held out
  assert out["detected_far"] == 1.0 and out["detected_near"] < 0.8
  with pytest.raises(ValueError, match="one per synthetic row"):
    evaluation.detection(real, synth, groups={"bad": far[:10]})
