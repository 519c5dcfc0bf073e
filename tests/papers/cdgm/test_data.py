"""C-DGM data (`papers/cdgm/data.py`): the generated table and the shared tables."""
import pytest

from iclr24_jax.papers import cdgm
from iclr24_jax.papers.cdgm import data as data_lib


def test_generated_table_satisfies_its_constraints():
  t = data_lib.load_generated()
  for split in (t.train, t.val, t.test):
    assert float(cdgm.violation_rate(split, t.constraints)) == 0.0
  # The reduction of the embedded constraints combines y_2's bounds into y_3 + y_4 - 2 y_1 <= 10.
  r = cdgm.reduce_constraints(t.constraints)
  assert r.stats["combinations"] >= 1


def test_shared_tables_load(shared_data):
  h = data_lib.load_heloc()
  assert h.train.shape == (7530, 24) and h.test.shape == (2092, 24) and h.label == 23
  f = data_lib.load_faults()
  assert f.num_features == 28 and f.num_classes == 7
  assert len(f.train) + len(f.val) + len(f.test) == 1941
  with pytest.raises(FileNotFoundError, match="does not exist"):
    data_lib.load_heloc("/nonexistent/cdgm")
