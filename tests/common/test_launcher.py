"""The absl launcher end to end, config errors, the classify experiment, and the bench helper."""
import json
import os
import subprocess
import sys

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launch(*args, timeout=180):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, "-m", "experiments.main", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_launcher_trains_writes_and_a_rerun_prints_the_result(tmp_path):
  wd = str(tmp_path / "classify")
  p = _launch("--config=configs/classify.py:tiny", f"--workdir={wd}")
  assert p.returncode == 0, p.stderr[-2000:]
  for f in ("metrics.jsonl", "results.json", "curves.png", "test_predictions.png", "checkpoints/config.json",
            "config.json", "status.json"):
    assert os.path.exists(os.path.join(wd, f)), f
  assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["20", "40", "config.json"]
  first = open(os.path.join(wd, "results.json")).read()
  assert json.loads(first)["resumed_from_step"] == 0
  assert '"test_accuracy"' in p.stdout
  # the packaged config by name, from another directory: the finished workdir is printed, nothing trains
  env = dict(os.environ, PYTHONPATH=ROOT)
  p = subprocess.run([sys.executable, "-m", "iclr24_jax.launch", "run", "--config=classify:tiny", f"--workdir={wd}"],
                     cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=180)
  assert p.returncode == 0, p.stderr[-2000:]
  assert "holds a finished run" in p.stdout and '"test_accuracy"' in p.stdout
  assert open(os.path.join(wd, "results.json")).read() == first


def test_unknown_config_key_is_named(tmp_path):
  p = _launch("--config=configs/classify.py:tiny", "--config.num_stepz=3", f"--workdir={tmp_path}")
  assert p.returncode != 0
  assert "num_stepz" in p.stderr


def test_unknown_variant_is_named():
  from iclr24_jax.configs import classify
  with pytest.raises(ValueError, match="unknown variant 'huge'"):
    classify.get_config("huge")


def test_missing_data_dir_is_named(tmp_path):
  p = _launch("--config=configs/classify.py:tiny", "--config.data.name=npz",
              f"--config.data.data_dir={tmp_path}/nowhere.npz", f"--workdir={tmp_path}/w")
  assert p.returncode != 0
  assert "nowhere.npz' does not exist" in p.stderr


def test_unknown_experiment_is_named():
  from iclr24_jax import registry
  with pytest.raises(ValueError, match="unknown experiment"):
    registry.experiment_module("nope")


def test_bench_time_fn_reports_compile_and_rate():
  from iclr24_jax.common import bench
  f = jax.jit(lambda x: (x @ x.T).sum())
  row = bench.time_fn(f, jax.numpy.ones((64, 64)), repeats=3, items=64, name="matmul", size=64)
  assert row["compile_s"] > 0 and row["median_s"] > 0 and row["items_per_s"] > 0
  assert row["size"] == 64 and row["compiled_bytes"] > 0
  table = bench.format_table([row], ["name", "size", "steps_per_s"])
  assert table.splitlines()[0] == "| name | size | steps_per_s |"


def test_digits_cnn_reaches_95_percent(tmp_path):
  from iclr24_jax.configs import classify as cfg
  from iclr24_jax.vision import experiment
  res = experiment.run(cfg.get_config(""), str(tmp_path))
  assert res["test_accuracy"] >= 0.95
