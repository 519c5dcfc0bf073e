"""Uni-O4 offline data (`papers/unio4/data.py`): returns, next actions and episode ends by hand, padding, clear
errors."""
import jax
import numpy as np
import pytest

from iclr24_jax.papers import unio4


def test_prepare_returns_next_actions_and_errors():
  # episode 1: rows 0-2 (terminal at 2), episode 2: rows 3-4 (timeout at 4); gamma = 0.5, r = 1:
  # G = [1 + .5 (1 + .5), 1 + .5, 1, 1 + .5, 1] = [1.75, 1.5, 1, 1.5, 1]
  ds = {"observations": np.arange(5, dtype=np.float32)[:, None],
        "actions": np.arange(5, dtype=np.float32)[:, None] / 10, "rewards": np.ones(5, np.float32),
        "next_observations": np.arange(1, 6, dtype=np.float32)[:, None],
        "terminals": np.asarray([0, 0, 1, 0, 0], bool), "timeouts": np.asarray([0, 0, 0, 0, 1], bool)}
  d = unio4.prepare(ds, gamma=0.5, state_norm=False, pad_to=8)
  np.testing.assert_allclose(np.asarray(d.returns[:5]), [1.75, 1.5, 1.0, 1.5, 1.0], rtol=1e-6)
  # a' = next row's action inside an episode; the row's own action at the terminal / the truncation
  np.testing.assert_allclose(np.asarray(d.next_actions[:5, 0]), [0.1, 0.2, 0.2, 0.4, 0.4], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(d.not_done[:5]), [1, 1, 0, 1, 1])
  assert d.observations.shape == (8, 1) and int(d.num_rows) == 5
  idx_rows = np.asarray(unio4.sample(jax.random.key(0), d, 256)["observations"][:, 0])
  assert idx_rows.max() <= 4  # padded rows are never drawn
  bad = dict(ds)
  bad.pop("timeouts")
  with pytest.raises(ValueError, match="lacks"):
    unio4.prepare(bad)
  nan = dict(ds)
  nan["rewards"] = np.asarray([1, np.nan, 1, 1, 1], np.float32)
  with pytest.raises(ValueError, match="NaN"):
    unio4.prepare(nan)
  with pytest.raises(ValueError, match="pad_to"):
    unio4.prepare(ds, pad_to=3)
