"""D4RL HDF5 files (h5py, the keys and dtypes D4RL writes) through rl.offline.load_d4rl, unio4.data.load and
ldcq.data.load; Motif's .npy pairs through motif.data.load."""
import numpy as np
import pytest

from iclr24_jax.common import data as common_data
from iclr24_jax.papers.ldcq import data as ldcq_data
from iclr24_jax.papers.motif import data as motif_data
from iclr24_jax.papers.unio4 import data as unio4_data
from iclr24_jax.rl import offline

h5py = pytest.importorskip("h5py")


def _write_d4rl(path, n=6, obs_dim=3, goal=False, rank_bug=False):
  path.parent.mkdir(parents=True, exist_ok=True)
  obs = np.arange(n * obs_dim, dtype=np.float32).reshape(n, obs_dim)
  with h5py.File(path, "w") as f:
    f["observations"] = obs
    f["actions"] = np.full((n, 2), 0.5, np.float32)
    f["rewards"] = np.arange(n, dtype=np.float32)[:, None] if rank_bug else np.arange(n, dtype=np.float32)
    f["terminals"] = np.array([0, 0, 1, 0, 0, 0], bool)[:n]
    f["timeouts"] = np.array([0, 0, 0, 0, 1, 0], bool)[:n]
    if goal:
      f["infos/goal"] = np.ones((n, 2), np.float32)
  return obs


def test_d4rl_hdf5_by_official_file_name(tmp_path):
  obs = _write_d4rl(tmp_path / "datasets" / "gym_mujoco_v2" / "hopper_medium-v2.hdf5")
  ds = unio4_data.load({"name": "hopper-medium-v2", "data_dir": str(tmp_path / "datasets")})
  # no next_observations in the file: rebuilt as d4rl.qlearning_dataset does, dropping the timeout row (4) and
  # the last row (5), whose successors are unknown; the terminal row (2) is kept
  np.testing.assert_array_equal(ds["observations"], obs[[0, 1, 2, 3]])
  np.testing.assert_array_equal(ds["next_observations"], obs[[1, 2, 3, 4]])
  assert ds["terminals"].dtype == np.bool_ and ds["terminals"].tolist() == [False, False, True, False]
  assert ds["rewards"].dtype == np.float32 and ds["actions"].shape == (4, 2)
  _write_d4rl(tmp_path / "d" / "maze2d-large-sparse-v1.hdf5", goal=True)
  ds = ldcq_data.load({"name": "maze2d-large-v1", "data_dir": str(tmp_path / "d")})
  assert ds["goals"].shape == (4, 2)
  ds_old = ldcq_data.load("maze/umaze", "noisy", data_path=str(tmp_path / "d" / "maze2d-large-sparse-v1.hdf5"))
  np.testing.assert_array_equal(ds_old["observations"], ds["observations"])   # the older call reads the same file


def test_d4rl_file_names():
  # d4rl/infos.py URL basenames: gym_mujoco_v2/<env>_<kind with underscores>-v2, maze2d/maze2d-<layout>-sparse-v1
  assert offline.d4rl_filenames("halfcheetah-medium-expert-v2") == ["halfcheetah-medium-expert-v2.hdf5",
                                                                    "halfcheetah_medium_expert-v2.hdf5"]
  assert offline.d4rl_filenames("maze2d-umaze-dense-v1") == ["maze2d-umaze-dense-v1.hdf5"]
  assert offline.d4rl_filenames("maze2d-medium-v1")[1] == "maze2d-medium-sparse-v1.hdf5"


def test_d4rl_errors(tmp_path):
  with pytest.raises(common_data.DataNotFoundError, match="hopper_medium_replay-v2.hdf5"):
    unio4_data.load({"name": "hopper-medium-replay-v2", "data_dir": str(tmp_path)})
  _write_d4rl(tmp_path / "walker2d-expert-v2.hdf5", rank_bug=True)
  with pytest.raises(common_data.DataFormatError, match=r"'rewards' has shape \(6, 1\)"):
    unio4_data.load({"name": "walker2d-expert-v2", "data_dir": str(tmp_path)})
  with pytest.raises(ValueError, match="unknown Uni-O4 D4RL"):
    unio4_data.load({"name": "hopper-medium-v0", "data_dir": str(tmp_path)})


def test_motif_pairs(tmp_path):
  root = tmp_path / "motif_dataset"
  (root / "data").mkdir(parents=True)
  (root / "preference").mkdir()
  msgs = np.zeros((4, 2, 1, 256), np.uint8)
  for i, (a, b) in enumerate((("You kill the newt!", "It's a wall."), ("Hello", ""), ("x", "y"), ("You die...", "ok"))):
    msgs[i, 0, 0, :len(a)] = np.frombuffer(a.encode(), np.uint8)
    msgs[i, 1, 0, :len(b)] = np.frombuffer(b.encode(), np.uint8)
  np.save(root / "data" / "message.npy", msgs)
  np.save(root / "preference" / "llama70b_msg_defaultgoal_default.npy", np.array([0, 3, 2, 1], np.int8))
  pairs = motif_data.load({"name": "motif", "data_dir": str(root)})
  assert len(pairs) == 3 and pairs.valid.tolist() == [0, 2, 3]          # the unknown (3) pair is skipped
  assert pairs.captions(0) == ("You kill the newt!", "It's a wall.") and pairs.captions(2) == ("You die...", "ok")
  np.testing.assert_array_equal(motif_data.preference_targets(pairs.preferences[pairs.valid]),
                                [[1, 0], [0.5, 0.5], [0, 1]])
  tr, va = pairs.split(0.8, seed=42)
  assert len(tr) == 2 and len(va) == 1 and set(tr) | set(va) == {0, 1, 2}
  with pytest.raises(common_data.DataNotFoundError, match="llama13b_msg_gold_default"):
    motif_data.load({"name": "motif_dataset", "data_dir": str(root), "annotator": "llama13b_msg_gold_default"})
  np.save(root / "data" / "message.npy", msgs[:, :, :, :100])
  with pytest.raises(common_data.DataFormatError, match="256"):
    motif_data.load({"name": "motif_dataset", "data_dir": str(root)})
