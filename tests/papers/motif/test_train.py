"""Motif training (`papers/motif/train.py`): arrays and splits, the oracle-values arm."""
import numpy as np
import pytest

from iclr24_jax.papers import motif
from iclr24_jax.papers.motif import toy, train


def test_pipeline_arrays_and_split():
  recs = [dict(caption_1="a", caption_2="b", label=0), dict(caption_1="a", caption_2="b", label=0),
          dict(caption_1="b", caption_2="c", label=None), dict(caption_1="c", caption_2="a", label=2),
          dict(caption_1="b", caption_2="a", label=1)]
  d = motif.to_arrays(recs)
  assert d["texts"] == ["a", "b", "c"]
  np.testing.assert_array_equal(d["pairs"], [[0, 1], [2, 0], [1, 0]])
  np.testing.assert_array_equal(d["labels"], [0, 2, 1])
  np.testing.assert_array_equal(d["weights"], [2, 1, 1])
  np.testing.assert_array_equal(d["occurrences"], [4, 3, 1])
  train, held = motif.split_by_pair(d, 0.5, seed=0)
  key = lambda p: tuple(sorted(p))
  assert not ({key(p) for p in train["pairs"].tolist()} & {key(p) for p in held["pairs"].tolist()})
  assert len(train["labels"]) + len(held["labels"]) == 3
  with pytest.raises(ValueError, match="no annotated pair"):
    motif.to_arrays([dict(caption_1="a", caption_2="b", label=None)])


def test_oracle_values_arm_without_a_reward_model():
  from iclr24_jax.configs import motif as cfg_mod
  c = cfg_mod.get_config("tiny")
  c.data.holdout = 0.0                                        # every pair trains: mu, sigma over all four messages
  recs = [dict(caption_1="You found the treasure!", caption_2="", label=0),
          dict(caption_1="You pick up a brass key.", caption_2="You bump into a wall.", label=None),
          dict(caption_1="You pick up a brass key.", caption_2="You bump into a wall.", label=0)]
  arm = motif.oracle_values_fit(c, recs)
  np.testing.assert_array_equal(arm["caption_rewards"], toy.caption_values())     # the oracle's own values
  # r = [goal 3, empty 0, key 1, bump -1], one occurrence each (the unlabelled record is dropped):
  # mu = 3 / 4 = 0.75; var = (2.25^2 + 0.75^2 + 0.25^2 + 1.75^2) / 4 = 8.75 / 4 = 2.1875, sigma = 1.479020;
  # eps = median of r_hat over the 4 unique messages = (0.5 - 0.75) / 1.479020 = -0.169031
  f = arm["fit"]
  np.testing.assert_allclose([f["mu"], f["sigma"], f["eps"]], [0.75, 1.479020, -0.169031], rtol=1e-5)
  fits = {"values": arm}
  st = train.toy_settings(c, fits, [("values", "intrinsic"), ("values", "both")])
  np.testing.assert_array_equal(st["caption_rewards"][0], toy.caption_values())
  np.testing.assert_allclose(st["alpha_ext"], [0.0, c.intrinsic.alpha_ext])
  with pytest.raises(ValueError, match="not a toy caption"):
    motif.oracle_values_fit(c, [dict(caption_1="You kill the newt!", caption_2="", label=0)])
