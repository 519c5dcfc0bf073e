"""Tables with linear constraints: HELOC and steel-plate faults (shared data), and an embedded generated table.

HELOC: the official train/val/test CSVs (23 features + `is_at_risk`, binary), `heloc_constraints.txt` (7).
Faults: the shared copy holds only `test_data.csv` (1,941 rows, 27 features + 7 one-hot fault columns). As in the
official `prepare_faults_dataset.py` layout, the 7 one-hot columns become one label column `faults` (index 27,
7 classes); the rows are split 70/15/15 with a fixed seed. Deviation: the official split files are not available.
Generated: a 7-column table (6 features + a binary label) whose rows satisfy known linear constraints by
construction, so the method runs without any data files.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

from iclr24_jax.common.data import resolve_data_dir, shared_data_dir
from iclr24_jax.papers.cdgm.constraints import Constraints, load_constraints, parse_constraints

# The embedded table's constraints (the generator below satisfies them; the FM reduction of y_2 produces
# y_3 + y_4 - 2 y_1 <= 10 for the set of y_4).
GENERATED_CONSTRAINTS = """\
ordering y_0 y_1 y_2 y_3 y_4 y_5 y_6
y_1 - y_0 > 0
y_2 - y_3 - y_4 >= 0
2y_1 - y_2 >= -10
y_3 >= 0
y_4 >= 0
y_5 >= 0
- y_5 >= -100
"""

CONSTRAINT_SETS = ("url", "wids", "lcld", "news", "botnet", "heloc", "faults")


@dataclasses.dataclass(frozen=True, eq=False)
class Table:
  """A tabular data set with a label column and constraints.

  Attributes:
    name: data set name.
    columns: D column names.
    train, val, test: [N, D] float64 rows.
    discrete: indices of discrete columns (the label at least).
    label: index of the label column.
    num_classes: classes of the label.
    constraints: the parsed constraints (variable y_i is column i).
    integer_columns: columns stored as integers in the CSV files (the official evaluation casts synthetic rows to
      the training dtypes, i.e. truncates these, before utility/detection).
  """

  name: str
  columns: tuple[str, ...]
  train: np.ndarray
  val: np.ndarray
  test: np.ndarray
  discrete: tuple[int, ...]
  label: int
  num_classes: int
  constraints: Constraints
  integer_columns: tuple[int, ...] = ()

  @property
  def num_features(self) -> int:
    return len(self.columns)


def cdgm_data_dir(data_dir: str | os.PathLike | None = None, required: bool = True) -> pathlib.Path | None:
  """The folder with the cdgm files: `data_dir` if given, else `<shared data>/cdgm`.

  Raises:
    FileNotFoundError: when required and absent, saying how to point at the data.
  """
  if data_dir:
    return resolve_data_dir(data_dir)
  root = shared_data_dir(required=required)
  if root is None:
    return None
  p = root / "cdgm"
  if not p.is_dir():
    if required:
      raise FileNotFoundError(f"{p} does not exist; set config.data.data_dir to the folder holding heloc/, faults/ "
                              "and the *_constraints.txt files, or use the embedded 'generated' table.")
    return None
  return p


def constraints_path(name: str, data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Path of `<name>/<name>_constraints.txt` in the cdgm data folder."""
  if name not in CONSTRAINT_SETS:
    raise ValueError(f"unknown constraint set '{name}'; known: {CONSTRAINT_SETS}.")
  p = cdgm_data_dir(data_dir) / name / f"{name}_constraints.txt"
  if not p.exists():
    raise FileNotFoundError(f"constraints file {p} not found.")
  return p


def load_named_constraints(name: str, data_dir: str | os.PathLike | None = None) -> Constraints:
  """Parses the official constraints of url / wids / lcld / news / botnet / heloc / faults."""
  return load_constraints(constraints_path(name, data_dir))


def _read_csv(path: pathlib.Path) -> tuple[list[str], np.ndarray, tuple[int, ...]]:
  import pandas as pd
  df = pd.read_csv(path)
  ints = tuple(i for i, dt in enumerate(df.dtypes) if dt.kind in "iu")
  return list(df.columns), df.to_numpy(np.float64), ints


def load_heloc(data_dir: str | os.PathLike | None = None) -> Table:
  """HELOC: 7,530 / 837 / 2,092 rows, 23 features + binary `is_at_risk` (column 23)."""
  d = cdgm_data_dir(data_dir) / "heloc"
  cols, train, ints = _read_csv(d / "train_data.csv")
  _, val, _ = _read_csv(d / "val_data.csv")
  _, test, _ = _read_csv(d / "test_data.csv")
  return Table("heloc", tuple(cols), train, val, test, discrete=(23,), label=23, num_classes=2,
               constraints=load_constraints(d / "heloc_constraints.txt"), integer_columns=ints)


def load_faults(data_dir: str | os.PathLike | None = None, seed: int = 0) -> Table:
  """Steel-plate faults: 27 features + `faults` (7 classes, column 27), 70/15/15 split of the 1,941 rows."""
  d = cdgm_data_dir(data_dir) / "faults"
  cols, raw, ints = _read_csv(d / "test_data.csv")
  if raw.shape[1] != 34:
    raise ValueError(f"{d / 'test_data.csv'} should have 27 features + 7 one-hot fault columns, got {raw.shape[1]}.")
  onehot = raw[:, 27:]
  if not np.all(onehot.sum(1) == 1):
    raise ValueError("the 7 fault columns of faults/test_data.csv are not one-hot.")
  data = np.concatenate([raw[:, :27], onehot.argmax(1)[:, None].astype(np.float64)], axis=1)
  perm = np.random.default_rng(seed).permutation(len(data))
  n_tr, n_va = int(0.7 * len(data)), int(0.15 * len(data))
  tr, va, te = perm[:n_tr], perm[n_tr:n_tr + n_va], perm[n_tr + n_va:]
  return Table("faults", tuple(cols[:27]) + ("faults",), data[tr], data[va], data[te], discrete=(27,), label=27,
               num_classes=7, constraints=load_constraints(d / "faults_constraints.txt"),
               integer_columns=tuple(i for i in ints if i < 27) + (27,))


def generated_rows(n: int, seed: int = 0) -> np.ndarray:
  """Rows of the embedded table (all satisfy `GENERATED_CONSTRAINTS`).

  Columns: y_0 x_min (bimodal), y_1 x_max = x_min + width, y_2 total >= y_3 + y_4 with y_2 <= 2 y_1 + 10,
  y_3, y_4 >= 0 parts, y_5 a percentage in [0, 100] (with a point mass at 100), y_6 binary label.
  """
  rng = np.random.default_rng(seed)
  mode = rng.random(n) < 0.4
  x_min = np.where(mode, rng.normal(10, 2, n), rng.normal(40, 5, n))
  width = rng.gamma(2.0, 3.0, n) + 0.5
  x_max = x_min + width
  a = rng.gamma(2.0, 4.0, n)
  b = rng.exponential(5.0, n)
  slack = rng.exponential(3.0, n)
  total = np.minimum(a + b + slack, 2 * x_max + 10)
  scale = np.where(a + b > total, total / np.maximum(a + b, 1e-9), 1.0)  # keep y_3 + y_4 <= y_2
  a, b = a * scale, b * scale
  pct = np.where(rng.random(n) < 0.2, 100.0, np.clip(rng.normal(60, 20, n), 0, 100))
  logit = 0.15 * (width - 6) + 0.05 * (pct - 60) / 10 + 0.08 * (a - b) + rng.normal(0, 0.5, n)
  label = (logit > 0).astype(np.float64)
  return np.stack([x_min, x_max, total, a, b, pct, label], axis=1)


def load_generated(n_train: int = 3000, n_val: int = 500, n_test: int = 1000, seed: int = 0) -> Table:
  """The embedded generated table (no files needed)."""
  data = generated_rows(n_train + n_val + n_test, seed)
  cols = ("x_min", "x_max", "total", "part_a", "part_b", "percentage", "label")
  return Table("generated", cols, data[:n_train], data[n_train:n_train + n_val], data[n_train + n_val:],
               discrete=(6,), label=6, num_classes=2, constraints=parse_constraints(GENERATED_CONSTRAINTS))


def load_table(name: str, data_dir: str | os.PathLike | None = None) -> Table:
  """'generated' (embedded), 'heloc' or 'faults'."""
  if name == "generated":
    return load_generated()
  if name == "heloc":
    return load_heloc(data_dir)
  if name == "faults":
    return load_faults(data_dir)
  raise ValueError(f"unknown table '{name}'; choose 'generated', 'heloc' or 'faults'.")


# ----------------------------------------------------------------------------------------------------------
# The paper's seven tables in the official layout (ConstrainedDGM data/<name>/).

DATASETS = {
    "url": "url/{train,val,test}_data.csv (+ url_constraints.txt); label: the last column (is_phishing)",
    "wids": "wids/{train,val,test}_data.csv (+ wids_constraints.txt); label: the last column (hospital_death)",
    "lcld": "lcld/{train,val,test}_data.csv (+ lcld_constraints.txt); label: the last column (charged_off)",
    "news": "news/{train,val,test}_data.csv (+ news_constraints.txt); label: the last column",
    "botnet": "botnet/{train,val,test}_data.csv (+ botnet_constraints.txt); label: the last column (is_botnet)",
    "heloc": "heloc/{train,val,test}_data.csv (+ heloc_constraints.txt): 23 features + is_at_risk",
    "faults": "faults/{train,val,test}_data.csv or test_data.csv alone (27 features + 7 one-hot fault columns, "
              "merged into one 7-class label) + faults_constraints.txt",
}
CDGM_SOURCE = ("the ConstrainedDGM repository (github.com/mihaela-stoian/ConstrainedDGM, data/<name>/: the "
               "*_constraints.txt files and the prepared train/val/test CSVs its README links)")


def load_official_table(name: str, root: str | os.PathLike) -> Table:
  """One of the paper's tables from `<root>/<name>/{train,val,test}_data.csv` and `<name>_constraints.txt`.

  The label is the last CSV column (the official evaluation's target); faults' 7 one-hot columns become one
  7-class label (as `load_faults`). Columns stored as integers keep that mark (`integer_columns`).

  Args:
    name: a key of DATASETS.
    root: the folder holding `<name>/`.

  Returns:
    Table with float64 rows [N, D].

  Raises:
    common.data.DataNotFoundError: a file is missing. common.data.DataFormatError: the three CSVs disagree on
      their columns, or the label is not integer-valued.
  """
  from iclr24_jax.common import data as common_data
  d = pathlib.Path(root) / name
  layout = DATASETS[name]
  files = {s: d / f"{s}_data.csv" for s in ("train", "val", "test")}
  if name == "faults" and not files["train"].exists() and files["test"].exists():
    return load_faults(root)   # the shared copy: test_data.csv only, split 70/15/15 here
  missing = [str(p) for p in list(files.values()) + [d / f"{name}_constraints.txt"] if not p.exists()]
  if missing:
    raise common_data.DataNotFoundError(f"cdgm '{name}': missing {missing}. Expected layout: {layout}. "
                                        f"Get it: {CDGM_SOURCE}.")
  parts = {s: _read_csv(p) for s, p in files.items()}
  cols, ints = parts["train"][0], parts["train"][2]
  for s in ("val", "test"):
    if parts[s][0] != cols:
      raise common_data.DataFormatError(f"cdgm '{name}': {files[s]} has columns {parts[s][0][:5]}...; "
                                        f"expected those of {files['train']} ({cols[:5]}...).")
  rows = {s: parts[s][1] for s in parts}
  if name == "faults":
    rows = {s: np.concatenate([r[:, :27], r[:, 27:].argmax(1)[:, None].astype(np.float64)], axis=1)
            for s, r in rows.items()}
    cols = cols[:27] + ["faults"]
    ints = tuple(i for i in ints if i < 27) + (27,)
  label = len(cols) - 1
  y = np.concatenate([r[:, label] for r in rows.values()])
  if not np.all(y == np.round(y)):
    raise common_data.DataFormatError(f"cdgm '{name}': the last column '{cols[label]}' is the label and must hold "
                                      "integer classes.")
  return Table(name, tuple(cols), rows["train"], rows["val"], rows["test"], discrete=(label,), label=label,
               num_classes=int(y.max()) + 1, constraints=load_constraints(d / f"{name}_constraints.txt"),
               integer_columns=tuple(sorted(set(ints) | {label})))


def load(data_config) -> Table:
  """The table `config.data.name` names, from `config.data.data_dir` (or `<shared data>/cdgm`).

  Args:
    data_config: config.data with `name` ('generated' or a key of DATASETS) and `data_dir`.

  Returns:
    Table.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: files missing (the message names them and the source).
  """
  from iclr24_jax.common import data as common_data
  name = common_data.config_value(data_config, "name")
  if name == "generated":
    return load_generated()
  if name not in DATASETS:
    raise ValueError(f"unknown cdgm table '{name}'; choose 'generated' or one of {sorted(DATASETS)}.")
  root = common_data.locate_data(data_config, "cdgm", what=f"cdgm '{name}'", layout=DATASETS[name],
                                 source=CDGM_SOURCE)
  return load_official_table(name, root)
