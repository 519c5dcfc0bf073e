"""Embedded data sets, user data paths and the resumable, host-sharded batch stream."""
import numpy as np
import pytest

from iclr24_jax.common import data


def test_digits_split_is_fixed_and_disjoint():
  a, b = data.load_digits(), data.load_digits()
  assert (len(a.train), len(a.val), len(a.test)) == (1257, 180, 360)
  np.testing.assert_array_equal(a.test.y, b.test.y)
  assert a.train.x.shape[1:] == (8, 8, 1) and a.train.x.dtype == np.float32
  assert 0.0 <= a.train.x.min() and a.train.x.max() <= 1.0
  rows = lambda s: {r.tobytes() for r in s.x.reshape(len(s), -1)}
  # digits has a few duplicate images; the index split itself must be disjoint and complete
  assert len(a.train) + len(a.val) + len(a.test) == 1797
  assert len(rows(a.test) & rows(a.train)) < 10


def test_mnist5k():
  d = data.load_mnist5k()
  assert (len(d.train), len(d.val), len(d.test)) == (4000, 500, 500)
  assert d.train.x.shape[1:] == (28, 28, 1)
  assert np.bincount(np.concatenate([d.train.y, d.val.y, d.test.y])).tolist() == [500] * 10


def test_batch_stream_is_deterministic_and_resumable():
  arrays = {"x": np.arange(100)[:, None], "y": np.arange(100)}
  s1 = data.BatchStream(arrays, 8, seed=3)
  s2 = data.BatchStream(arrays, 8, seed=3)
  seq = [s1(i)["y"] for i in range(30)]
  np.testing.assert_array_equal(s2(17)["y"], seq[17])  # random access = resume at any step
  epoch0 = np.concatenate(seq[:12])                     # 100 // 8 = 12 steps per epoch
  assert len(set(epoch0.tolist())) == 96                # no repeats inside an epoch
  assert not np.array_equal(seq[0], seq[12])            # a new permutation per epoch


def test_batch_stream_host_slices_reassemble():
  arrays = {"y": np.arange(64)}
  full = data.BatchStream(arrays, 16, seed=0, process_index=0, process_count=1)
  parts = [data.BatchStream(arrays, 16, seed=0, process_index=i, process_count=2) for i in range(2)]
  for step in range(5):
    np.testing.assert_array_equal(np.concatenate([p(step)["y"] for p in parts]), full(step)["y"])


def test_eval_batches_pad_and_mask():
  out = list(data.eval_batches({"x": np.arange(10)}, 4))
  assert [b["x"].shape for b, _ in out] == [(4,)] * 3
  assert out[-1][1].tolist() == [True, True, False, False]


def test_clear_errors_on_bad_data_paths(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist; point config.data.data_dir"):
    data.load_dataset("npz", str(tmp_path / "missing.npz"))
  with pytest.raises(ValueError, match="unknown data set"):
    data.load_dataset("imagenet")
  with pytest.raises(ValueError, match="larger than the data set"):
    data.BatchStream({"x": np.zeros(4)}, 8)


def test_npz_user_dataset(tmp_path):
  rng = np.random.default_rng(0)
  p = tmp_path / "toy.npz"
  np.savez(p, x_train=rng.normal(size=(50, 3)), y_train=rng.integers(0, 3, 50), x_test=rng.normal(size=(10, 3)),
           y_test=rng.integers(0, 3, 10))
  d = data.load_dataset("npz", str(p))
  assert len(d.train) + len(d.val) == 50 and len(d.test) == 10 and d.num_classes == 3


def test_natural_images():
  imgs = data.load_natural_images(size=32)
  assert len(imgs) >= 4
  for v in imgs.values():
    assert v.shape == (32, 32, 3) and v.dtype == np.float32


def test_shared_data_dir_env(tmp_path, monkeypatch):
  monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
  assert data.shared_data_dir() == tmp_path
