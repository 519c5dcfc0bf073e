"""common.data's readers of the papers' own data: where files are looked for, the named errors, text records in
JSON / JSON lines / parquet / the HF layouts, the image transforms against hand-computed values, TFDS sources
sharded per process and grain shards."""
import gzip
import json

import numpy as np
import pytest

from iclr24_jax.common import data


def test_locate_data_names_layout_and_source(tmp_path, monkeypatch):
  (tmp_path / "set").mkdir()
  assert data.locate_data({"data_dir": str(tmp_path / "set")}, "set", what="X", layout="L", source="S") == tmp_path / "set"
  with pytest.raises(data.DataNotFoundError, match=r"X not found: .*missing does not exist\. Expected layout: L\..*Get it: S"):
    data.locate_data({"data_dir": str(tmp_path / "missing")}, "set", what="X", layout="L", source="S")
  monkeypatch.setenv(data.DATA_ENV, str(tmp_path))   # no data_dir: $ICLR24_DATA/<sub>
  assert data.locate_data({"data_dir": ""}, "set", what="X", layout="L", source="S") == tmp_path / "set"
  with pytest.raises(data.DataNotFoundError, match="ICLR24_DATA"):
    data.locate_data({"data_dir": ""}, "other", what="X", layout="L", source="S")
  assert issubclass(data.DataNotFoundError, FileNotFoundError) and issubclass(data.DataFormatError, ValueError)


def test_read_records_every_published_text_format(tmp_path, write_parquet):
  rows = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
  (tmp_path / "list.json").write_text(json.dumps(rows))
  (tmp_path / "keyed.jsonl").write_text(json.dumps({"0": rows[0], "1": rows[1]}))   # MaRio: one keyed object
  (tmp_path / "lines.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  with gzip.open(tmp_path / "lines.jsonl.gz", "wt") as f:
    f.write("\n".join(json.dumps(r) for r in rows))
  write_parquet(tmp_path / "t.parquet", rows)
  import pyarrow as pa
  table = pa.Table.from_pylist(rows)
  with pa.OSFile(str(tmp_path / "data-00000-of-00001.arrow"), "wb") as sink:   # datasets' save_to_disk shard
    with pa.ipc.new_stream(sink, table.schema) as w:
      w.write_table(table)
  for name in ("list.json", "keyed.jsonl", "lines.jsonl", "lines.jsonl.gz", "t.parquet", "data-00000-of-00001.arrow"):
    assert data.read_records(tmp_path / name) == rows, name
  (tmp_path / "bad.json").write_text('{"x": 1}')
  with pytest.raises(data.DataFormatError, match="keyed"):
    data.read_records(tmp_path / "bad.json")


def test_hf_layouts(tmp_path, write_parquet):
  write_parquet(tmp_path / "hub" / "data" / "train-00001-of-00002.parquet", [{"t": "b"}])
  write_parquet(tmp_path / "hub" / "data" / "train-00000-of-00002.parquet", [{"t": "a"}])
  assert [r["t"] for r in data.read_hf_split(tmp_path / "hub", "train", what="hub")] == ["a", "b"]   # shard order
  with pytest.raises(data.DataFormatError, match=r"lacks columns \['text'\]"):
    data.read_hf_split(tmp_path / "hub", "train", what="hub", required_columns=("text",))
  with pytest.raises(data.DataNotFoundError, match="no 'test' split"):
    data.read_hf_split(tmp_path / "hub", "test", what="hub")


def test_image_transforms_hand_values():
  # to_signed_unit: 0 -> -1, 255 -> 1, 51 -> 51 / 127.5 - 1 = -0.6
  np.testing.assert_allclose(data.to_signed_unit(np.array([0, 255, 51], np.uint8)), [-1.0, 1.0, -0.6], rtol=1e-6)
  # clip_preprocess of a constant colour (10, 128, 250): every pixel is (v / 255 - mean) / std
  img = np.broadcast_to(np.array([10, 128, 250], np.uint8), (300, 400, 3)).copy()
  out = data.clip_preprocess(img)
  want = (np.array([10, 128, 250]) / 255.0 - np.array(data.CLIP_MEAN)) / np.array(data.CLIP_STD)
  assert out.shape == (224, 224, 3) and out.dtype == np.float32
  np.testing.assert_allclose(out[100, 100], want, rtol=1e-5)
  # center_crop_arr: a 256 image at 256 is returned unchanged; 600x400 -> short side 400 >= 2 * 128: one box
  # halving to 300x200, bicubic 200 -> 128, then the centre 128 x 128
  rng = np.random.default_rng(0)
  same = rng.integers(0, 256, (256, 256, 3)).astype(np.uint8)
  np.testing.assert_array_equal(data.center_crop_arr(same, 256), same)
  stripes = np.zeros((400, 600, 3), np.uint8)
  stripes[:, 250:350] = 255          # a centred vertical band, 100 / 600 of the width
  crop = data.center_crop_arr(stripes, 128)
  assert crop.shape == (128, 128, 3)
  # after scaling 600 -> 192 wide, the band spans columns 80..112 of the full image, i.e. 48..80 of the crop
  assert crop[64, 64, 0] > 250 and crop[64, 10, 0] < 5 and crop[64, 120, 0] < 5


def test_image_folder_and_process_shards(tmp_path, write_png):
  for i in range(5):
    write_png(tmp_path / f"img{i}.png", np.full((4, 4, 3), 10 * i, np.uint8))
  files = data.list_images(tmp_path)
  assert [f.name for f in files] == [f"img{i}.png" for i in range(5)]
  src = data.ImageFolderSource(files, data.to_signed_unit, labels=[0, 1, 0, 1, 0])
  p0 = data.process_shard(src, process_index=0, process_count=2)
  p1 = data.process_shard(src, process_index=1, process_count=2)
  assert len(p0) == 3 and len(p1) == 2                       # records 0, 2, 4 and 1, 3: disjoint, complete
  np.testing.assert_allclose(p1[0]["image"][0, 0], [10 / 127.5 - 1] * 3, rtol=1e-6)
  assert [int(r["label"]) for r in (p0[0], p0[1], p1[1])] == [0, 0, 1]


def test_tfds_source_shards_per_process_and_fails_with_the_build_command(tmp_path):
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(num_examples=6):
    src = data.tfds_source("cifar10", tmp_path, "train", process_index=0, process_count=2)
    rec = src[0]
    assert np.asarray(rec["image"]).shape == (32, 32, 3) and np.asarray(rec["image"]).dtype == np.uint8
    ds = data.tfds_dataset("cifar10", tmp_path, val_fraction=0.5)
  assert ds.train.x.dtype == np.float32 and 0.0 <= ds.train.x.min() and ds.train.x.max() <= 1.0
  assert (len(ds.train), len(ds.val), len(ds.test)) == (3, 3, 6) and ds.num_classes == 10
  assert 0 <= ds.test.y.min() and ds.test.y.max() < 10
  with pytest.raises(data.DataNotFoundError, match="tfds build cifar10"):
    data.tfds_source("cifar10", tmp_path, "train")
