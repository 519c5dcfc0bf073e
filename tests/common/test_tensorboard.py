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


def test_a_resumed_writer_hides_the_interrupted_runs_later_steps(tmp_path):
  logdir = str(tmp_path / "tb")
  first = tensorboard.TensorBoardWriter(logdir)
  for step in (10, 20, 30):            # the interrupted run logged up to 30; its last checkpoint was at 20
    first.write_scalars(step, {"loss": float(step)})
  first.close()
  resumed = tensorboard.TensorBoardWriter(logdir, purge_step=21)
  for step in (30, 40):
    resumed.write_scalars(step, {"loss": step + 0.5})
  resumed.close()
  assert tensorboard.read_scalars(logdir) == {"loss": [(10, 10.0), (20, 20.0), (30, 30.5), (40, 40.5)]}


def test_open_writer_is_the_one_constructor_and_closes_as_a_context(tmp_path):
  from iclr24_jax.common import metrics
  workdir = str(tmp_path)
  assert metrics.open_writer(None) is None                          # no workdir: nothing written
  with metrics.open_writer(workdir) as w:                           # fresh run
    for step in (10, 20, 30):
      w.write(step, {"loss": float(step)})
  assert w.tensorboard is None                                      # closed on leaving the block
  with metrics.open_writer(workdir, 20) as w:                       # resumed from the checkpoint of step 20
    w.write(30, {"loss": 30.5})
  assert [(r["step"], r["loss"]) for r in metrics.read_jsonl(w.path)] == [(10, 10.0), (20, 20.0), (30, 30.5)]
  assert tensorboard.read_scalars(str(tmp_path / "tensorboard")) == {"loss": [(10, 10.0), (20, 20.0), (30, 30.5)]}
  with metrics.open_writer(workdir) as w:                           # a fresh start replaces both
    w.write(1, {"loss": 1.0})
  assert metrics.read_jsonl(w.path) == [{"step": 1, "loss": 1.0}]
  assert tensorboard.read_scalars(str(tmp_path / "tensorboard")) == {"loss": [(1, 1.0)]}
