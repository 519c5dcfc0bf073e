"""DA-CLIP's degradation suite (`papers/daclip/degradations.py`): deterministic, named, each type
by its defining property."""
import chex
import numpy as np
import pytest

from iclr24_jax.papers import daclip


def test_degradation_suite_is_deterministic_and_named():
  x, _ = daclip.load_clean_digits(dataset="digits", size=16)
  chex.assert_shape(x, (1797, 16, 16, 1))
  assert len(daclip.DEGRADATIONS) >= 6
  suite = daclip.make_suite(x[:21], seed=3, types=np.arange(21) % 7)
  again = daclip.make_suite(x[:21], seed=3, types=np.arange(21) % 7)
  np.testing.assert_array_equal(suite["lq"], again["lq"])
  assert suite["lq"].min() >= 0 and suite["lq"].max() <= 1 and suite["lq"].dtype == np.float32
  gt, lq = suite["gt"], suite["lq"]
  # hazy: x t + A (1 - t) with t <= 0.6, A >= 0.7 lifts the black background to >= 0.28.
  assert lq[1].min() >= 0.7 * 0.4 - 1e-6
  # low-light: at most 0.35 of the peak.
  assert lq[3].max() <= 0.35 + 1e-6
  # uncompleted: some pixels set to exactly 1 that were not.
  assert np.any((lq[6] == 1.0) & (gt[6] < 1.0))
  # every type changes the image
  assert all(np.abs(lq[i] - gt[i]).mean() > 1e-3 for i in range(7))
  assert daclip.degradation_captions([0, 4]) == ["motion-blurry", "noisy"]
  with pytest.raises(ValueError, match="unknown degradation"):
    daclip.degrade_one(x[0], "foggy", np.random.default_rng(0))
  with pytest.raises(ValueError, match="one degradation per image"):
    daclip.degrade(x[:3], [0, 1])
