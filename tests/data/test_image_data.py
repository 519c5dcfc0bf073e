"""The image-set loaders on data in their published formats: prepared TFDS folders (tfds.testing.mock_data, no
TensorFlow), FFHQ / ImageNet image folders (fps), DA-CLIP's <degradation>/{LQ,GT} folders, DomainBed's
<domain>/<class>/ folders (nci) and CUB-200-2011's text tables (safeguards)."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from iclr24_jax.common import data as common_data
from iclr24_jax.papers.clip_ood import data as clip_data
from iclr24_jax.papers.coboosting import data as cb_data
from iclr24_jax.papers.d2pruning import data as d2_data
from iclr24_jax.papers.daclip import data as daclip_data
from iclr24_jax.papers.fps import data as fps_data
from iclr24_jax.papers.mdm import data as mdm_data
from iclr24_jax.papers.nci import data as nci_data
from iclr24_jax.papers.safeguards import data as sg_data


def test_tfds_sets_in_memory(tmp_path):
  with tfds.testing.mock_data(num_examples=4):
    for name, shape, classes in (("svhn", (32, 32, 3), 10), ("mnist", (28, 28, 1), 10), ("cifar100", (32, 32, 3), 100)):
      ds = cb_data.load({"name": name, "data_dir": str(tmp_path)})
      assert ds.train.x.shape == (4,) + shape and ds.train.x.dtype == np.float32 and ds.num_classes == classes
      assert 0.0 <= ds.train.x.min() and ds.train.x.max() <= 1.0 and ds.train.y.max() < classes
      assert len(ds.val) == 0                                       # Co-Boosting: all of train to the clients
    ds = d2_data.load({"name": "cifar10", "data_dir": str(tmp_path), "val_fraction": 0.25})
    assert (len(ds.train), len(ds.val), len(ds.test)) == (3, 1, 4)


def test_tfds_imagenet_streams(tmp_path):
  with tfds.testing.mock_data(num_examples=3):
    splits = d2_data.load({"name": "imagenet", "data_dir": str(tmp_path)})
    rec = splits["validation"][0]
    assert rec["image"].shape == (224, 224, 3) and rec["image"].dtype == np.float32 and rec["label"].dtype == np.int32
    assert np.isfinite(rec["image"]).all() and 0 <= int(rec["label"]) < 1000
    rec = mdm_data.load({"name": "imagenet", "data_dir": str(tmp_path), "image_size": 64})["train"][0]
    assert rec["image"].shape == (64, 64, 3) and -1.0 <= rec["image"].min() and rec["image"].max() <= 1.0
    bench = clip_data.load({"name": "imagenet", "data_dir": str(tmp_path), "benchmarks": ("imagenet_r", "imagenet_a")})
    assert sorted(bench) == ["imagenet_a", "imagenet_r"] and bench["imagenet_r"][0]["image"].shape == (224, 224, 3)
  with pytest.raises(common_data.DataNotFoundError, match="tfds build imagenet2012"):
    mdm_data.load({"name": "imagenet", "data_dir": str(tmp_path)})


def test_fps_image_folder(tmp_path, write_png):
  write_png(tmp_path / "ffhq" / "00001.png", np.full((256, 256, 3), 51, np.uint8))
  write_png(tmp_path / "ffhq" / "00000.png", np.zeros((256, 256, 3), np.uint8))
  write_png(tmp_path / "ffhq" / "sub" / "00002.jpg", np.full((300, 200, 3), 255, np.uint8))
  ds = fps_data.load({"name": "ffhq", "data_dir": str(tmp_path / "ffhq"), "image_size": 256})
  assert len(ds) == 3 and ds[0]["path"].endswith("00000.png")          # sorted paths, recursive
  np.testing.assert_allclose(ds[1]["image"], np.full((256, 256, 3), 51 / 127.5 - 1, np.float32), rtol=1e-6)
  assert ds[2]["image"].shape == (256, 256, 3) and np.allclose(ds[2]["image"], 1.0, atol=1e-6)   # cropped 300x200
  (tmp_path / "empty").mkdir()
  with pytest.raises(common_data.DataNotFoundError, match="no image files"):
    fps_data.load({"name": "imagenet", "data_dir": str(tmp_path / "empty")})


def test_daclip_lq_gt_pairs(tmp_path, write_png):
  root = tmp_path / "universal"
  for t, n in (("noisy", 2), ("hazy", 1)):
    for k in range(n):
      write_png(root / "val" / t / "LQ" / f"{k}.png", np.full((8, 8, 3), 10 * k + 1, np.uint8))
      write_png(root / "val" / t / "GT" / f"{k}.png", np.full((8, 8, 3), 10 * k + 2, np.uint8))
  out = daclip_data.load({"name": "universal", "data_dir": str(root), "degradations": ("noisy", "hazy"),
                          "splits": ("val",), "clip_size": 32})
  val = out["val"]
  # round-robin over types as the official validation order: noisy/0, hazy/0, noisy/1
  assert [int(val[i]["type"]) for i in range(3)] == [0, 1, 0] and out["types"] == ("noisy", "hazy")
  np.testing.assert_allclose(val[2]["lq"][0, 0], [11 / 255] * 3, rtol=1e-6)   # LQ and GT of one pair, in [0, 1]
  np.testing.assert_allclose(val[2]["gt"][0, 0], [12 / 255] * 3, rtol=1e-6)
  assert val[0]["lq_clip"].shape == (32, 32, 3)
  rec = {"lq": np.arange(8 * 8 * 3, dtype=np.float32).reshape(8, 8, 3)}
  rec["gt"] = rec["lq"].copy()
  patch = daclip_data.random_patch(rec, 4, np.random.default_rng(0))
  assert patch["lq"].shape == (4, 4, 3) and np.array_equal(patch["lq"], patch["gt"])   # one crop / flip for both
  write_png(root / "val" / "hazy" / "LQ" / "9.png", np.zeros((8, 8, 3), np.uint8))
  with pytest.raises(common_data.DataFormatError, match="2 LQ vs 1 GT"):
    daclip_data.load({"name": "universal", "data_dir": str(root), "degradations": ("hazy",), "splits": ("val",)})
  with pytest.raises(common_data.DataNotFoundError, match="val/rainy/LQ"):
    daclip_data.load({"name": "universal", "data_dir": str(root), "degradations": ("rainy",), "splits": ("val",)})


def test_nci_domainbed_folders(tmp_path, write_png):
  for dom in ("art_painting", "cartoon", "photo", "sketch"):
    for c, cls in enumerate(("dog", "elephant")):
      write_png(tmp_path / "PACS" / dom / cls / "a.jpg", np.full((10, 12, 3), 100 + c, np.uint8))
  out = nci_data.load({"name": "pacs", "data_dir": str(tmp_path), "image_size": 8})
  assert out["classes"] == ("dog", "elephant") and sorted(out["domains"]) == ["art_painting", "cartoon", "photo",
                                                                             "sketch"]
  rec = out["domains"]["photo"][1]
  assert int(rec["label"]) == 1 and rec["image"].shape == (8, 8, 3)
  want = (101 / 255 - np.asarray(common_data.IMAGENET_MEAN)) / np.asarray(common_data.IMAGENET_STD)   # DomainBed
  np.testing.assert_allclose(rec["image"][3, 3], want, rtol=1e-5)
  (tmp_path / "PACS" / "sketch" / "giraffe").mkdir()
  with pytest.raises(common_data.DataFormatError, match="class folders"):
    nci_data.load({"name": "pacs", "data_dir": str(tmp_path)})
  with pytest.raises(common_data.DataNotFoundError, match="DomainBed"):
    nci_data.load({"name": "office_home", "data_dir": str(tmp_path)})


def test_safeguards_cub_tables(tmp_path):
  cub = tmp_path / "CUB_200_2011"
  (cub / "attributes").mkdir(parents=True)
  # six images: classes 1, 1, 2, 2, 101, 101 (ids 1..6); images 5, 6 are the test split
  (cub / "images.txt").write_text("".join(f"{i} {c:03d}.Bird/img{i}.jpg\n" for i, c in
                                          zip(range(1, 7), (1, 1, 2, 2, 101, 101))))
  (cub / "image_class_labels.txt").write_text("".join(f"{i} {c}\n" for i, c in zip(range(1, 7), (1, 1, 2, 2, 101, 101))))
  (cub / "train_test_split.txt").write_text("".join(f"{i} {int(i <= 4)}\n" for i in range(1, 7)))
  present = {1: (1, 0, 1), 2: (1, 0, 0), 3: (1, 1, 0), 4: (0, 1, 0), 5: (0, 1, 1), 6: (0, 0, 1)}
  lines = [f"{i} {a + 1} {p[a]} 3 10.0\n" for i, p in present.items() for a in range(3)]
  lines[0] = lines[0].rstrip("\n") + " 0\n"                       # the file's known lines with an extra field
  (cub / "attributes" / "image_attribute_labels.txt").write_text("".join(lines))
  out = sg_data.load({"name": "cub", "data_dir": str(tmp_path), "min_classes": 2, "val_fraction": 0.5})
  # class-level majority (>= half the class's images): class 1 -> (1, 0, 1), class 2 -> (1, 1, 0),
  # class 101 -> (0, 1, 1); every attribute is 1 in 2 classes, so all three are kept with min_classes 2
  assert out["concept_names"] == ("attribute_1", "attribute_2", "attribute_3") and out["num_classes"] == 200
  np.testing.assert_array_equal(out["test"].c, [[0, 1, 1], [0, 1, 1]])
  np.testing.assert_array_equal(out["test"].y, [100, 100])
  assert len(out["train"]) == 2 and len(out["val"]) == 2 and out["train"].c.dtype == np.float32
  assert out["test"].paths[0].endswith("images/101.Bird/img5.jpg")
  out = sg_data.load({"name": "cub", "data_dir": str(tmp_path), "min_classes": 3, "cub_target": "binary"})
  assert out["concept_names"] == () and out["test"].y.tolist() == [1, 1]   # no attribute reaches 3 classes
  with pytest.raises(common_data.DataNotFoundError, match="Caltech"):
    sg_data.load({"name": "cub", "data_dir": str(tmp_path / "nope")})
