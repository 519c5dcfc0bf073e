"""Writers of tiny files in the published formats the paper loaders read (each test builds its own in tmp_path)."""
import gzip
import json
import pathlib

import numpy as np
import pytest


@pytest.fixture
def write_png():
  """write_png(path, uint8 [H, W, C] array) -> path (PNG via PIL; folders created)."""
  from PIL import Image

  def write(path, array):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.asarray(array, np.uint8)
    Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a).save(path)
    return path
  return write


@pytest.fixture
def write_parquet():
  """write_parquet(path, list of dicts) -> path (pyarrow; nested dicts become structs)."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  def write(path, rows):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
  return write


@pytest.fixture
def write_jsonl():
  """write_jsonl(path, rows): JSON lines, gzipped when the name ends in .gz."""

  def write(path, rows):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.suffix == ".gz":
      with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    else:
      path.write_text(text)
    return path
  return write
