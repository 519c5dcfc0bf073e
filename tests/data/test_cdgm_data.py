"""cdgm.data.load on the official layout data/<name>/{train,val,test}_data.csv + <name>_constraints.txt."""
import numpy as np
import pytest

from iclr24_jax.common import data as common_data
from iclr24_jax.papers.cdgm import data as cdgm_data


def _write_table(root, name, header, rows):
  d = root / name
  d.mkdir(parents=True, exist_ok=True)
  for split, part in zip(("train", "val", "test"), (rows[:4], rows[4:5], rows[5:])):
    (d / f"{split}_data.csv").write_text(",".join(header) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in part))
  (d / f"{name}_constraints.txt").write_text("ordering y_0 y_1 y_2\ny_0 - y_1 >= 0\n")


def test_official_table(tmp_path):
  rows = [(5, 1.5, 0), (7, 2.0, 1), (3, 0.5, 0), (9, 8.25, 1), (4, 4.0, 0), (6, 1.0, 1)]
  _write_table(tmp_path, "url", ["length_url", "ratio", "is_phishing"], rows)
  t = cdgm_data.load({"name": "url", "data_dir": str(tmp_path)})
  assert t.train.shape == (4, 3) and t.val.shape == (1, 3) and t.test.shape == (1, 3) and t.train.dtype == np.float64
  assert t.label == 2 and t.num_classes == 2 and t.columns[-1] == "is_phishing"
  assert t.integer_columns == (0, 2)                       # length_url and the label are stored as integers
  # 'y_0 - y_1 >= 0' parsed into the normal form a . y >= b with a = (1, -1, 0), b = 0
  np.testing.assert_array_equal(t.constraints.coefficients, [[1.0, -1.0, 0.0]])
  np.testing.assert_array_equal(t.constraints.constants, [0.0])
  np.testing.assert_array_equal(t.test, [[6, 1.0, 1]])


def test_faults_one_hot_becomes_one_label(tmp_path):
  header = [f"f{i}" for i in range(27)] + [f"fault{k}" for k in range(7)]
  rows = [tuple(range(27)) + tuple(int(k == j % 7) for k in range(7)) for j in range(6)]
  _write_table(tmp_path, "faults", header, rows)
  t = cdgm_data.load({"name": "faults", "data_dir": str(tmp_path)})
  assert t.train.shape == (4, 28) and t.label == 27 and t.num_classes == 6   # classes 0..5 occur (rows 0..5)
  np.testing.assert_array_equal(t.train[:, 27], [0, 1, 2, 3])


def test_missing_and_mismatched(tmp_path):
  with pytest.raises(common_data.DataNotFoundError, match="ConstrainedDGM"):
    cdgm_data.load({"name": "wids", "data_dir": str(tmp_path)})
  _write_table(tmp_path, "news", ["a", "y"], [(1, 0), (2, 1), (3, 0), (4, 1), (5, 0), (6, 1)])
  (tmp_path / "news" / "val_data.csv").write_text("b,y\n1,0\n")
  with pytest.raises(common_data.DataFormatError, match="columns"):
    cdgm_data.load({"name": "news", "data_dir": str(tmp_path)})
  assert set(cdgm_data.DATASETS) == set(cdgm_data.CONSTRAINT_SETS)
