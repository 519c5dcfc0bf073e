"""Co-Boosting partition (`papers/coboosting/partition.py`): Dirichlet label skew, coverage, determinism, errors."""
import jax
import numpy as np
import pytest

from iclr24_jax.common import data as data_lib
from iclr24_jax.papers import coboosting
from iclr24_jax.papers.coboosting import partition


def test_partition_covers_every_index_once_with_balanced_sizes():
  y = np.random.default_rng(0).integers(0, 10, 1003)
  parts = coboosting.dirichlet_partition(y, 10, 0.1, jax.random.key(0))
  assert len(parts) == 10
  allidx = np.concatenate(parts)
  np.testing.assert_array_equal(np.sort(allidx), np.arange(1003))
  sizes = [len(p) for p in parts]
  assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


def test_partition_label_skew_grows_as_alpha_shrinks():
  y = data_lib.load_digits().train.y
  ent = {a: partition.mean_label_entropy(y, coboosting.dirichlet_partition(y, 10, a, jax.random.key(1)), 10)
         for a in (0.1, 1.0, 100.0)}
  assert ent[0.1] < ent[1.0] < ent[100.0]
  assert ent[100.0] > 0.95 * np.log(10)  # near-IID clients see (almost) every class evenly


def test_partition_is_deterministic_in_the_key():
  y = np.arange(200) % 5
  a = coboosting.dirichlet_partition(y, 4, 0.3, jax.random.key(3))
  b = coboosting.dirichlet_partition(y, 4, 0.3, jax.random.key(3))
  for pa, pb in zip(a, b):
    np.testing.assert_array_equal(pa, pb)


def test_partition_errors():
  y = np.arange(20) % 2
  with pytest.raises(ValueError, match="alpha"):
    coboosting.dirichlet_partition(y, 2, 0.0, jax.random.key(0))
  with pytest.raises(ValueError, match="num_clients"):
    coboosting.dirichlet_partition(y, 21, 0.5, jax.random.key(0))
  with pytest.raises(ValueError, match="1-D integer"):
    coboosting.dirichlet_partition(y.astype(np.float32), 2, 0.5, jax.random.key(0))
