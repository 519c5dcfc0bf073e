"""TensorBoard event files: what is written is read back exactly (no TensorFlow involved)."""
import numpy as np

from iclr24_jax.common import tensorboard


def test_scalars_round_trip(tmp_path):
  w = tensorboard.TensorBoardWriter(str(tmp_path / "tb"))
  w.write_scalars(10, {"train/loss": 0.5, "eval/auc": np.float32(0.75), "note": "text", "bad": float("nan")})
  w.write_scalars(20, {"train/loss": 0.25, "flag": True})
  w.close()
  got = tensorboard.read_scalars(str(tmp_path / "tb"))
  # 0.5, 0.25 and 0.75 are exact in float32 (the event format's precision); strings, NaN and bools are skipped.
  assert got == {"train/loss": [(10, 0.5), (20, 0.25)], "eval/auc": [(10, 0.75)]}


def test_read_scalars_names_an_empty_folder(tmp_path):
  import pytest
  with pytest.raises(FileNotFoundError, match="events.out.tfevents"):
    tensorboard.read_scalars(str(tmp_path))
