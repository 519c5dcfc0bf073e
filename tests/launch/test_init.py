"""The `iclr24` console script (`iclr24_jax.launch.main`, this package's __init__) from a plain (non-editable)
install, run from another directory: configs are packaged, experiments run.

Builds the project as a wheel into a temporary --target folder (no dependencies: the test venv has them), then,
from an unrelated working directory, imports the installed copy and runs a fast reproduction of one experiment.
"""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  target = tmp_path_factory.mktemp("site")
  proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                         "--no-index", "--target", str(target), str(ROOT)], capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return target


def _run(args, target, cwd):
  env = dict(os.environ, PYTHONPATH=str(target), ICLR24_DATA=str(ROOT.parent / "shared" / "data"))
  return subprocess.run([sys.executable] + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_installed_copy_imports_packaged_configs(installed, tmp_path):
  code = ("import iclr24_jax, json, importlib.util\n"
          "from iclr24_jax.configs import pmp, nci\n"
          "from iclr24_jax.rl import offline\n"
          "from iclr24_jax import launch\n"
          "print(json.dumps([iclr24_jax.__file__, launch.__file__, pmp.get_config('tiny').paper]))")
  proc = _run(["-c", code], installed, tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lib_file, launch_file, paper = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
  assert lib_file.startswith(str(installed)) and launch_file.startswith(str(installed)), (lib_file, launch_file)
  assert paper == "pmp"
  assert (installed / "iclr24_jax" / "rl" / "reference_returns.json").is_file()
  # the wheel installs the library only: no top-level `experiments` package to collide with a user's own
  assert not (installed / "experiments").exists()
  assert sorted(p.name for p in installed.iterdir() if (p / "__init__.py").exists()) == ["iclr24_jax"]


def test_installed_console_script_runs_a_packaged_config_elsewhere(installed, tmp_path):
  script = installed / "bin" / "iclr24"
  assert script.is_file()
  proc = _run([str(script), "run", "--config=pmp:tiny,nobaselines", "--workdir=runs/pmp"], installed, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (tmp_path / "runs" / "pmp" / "results.json").is_file() and '"test.auc"' in proc.stdout


def test_installed_copy_runs_a_fast_reproduction_elsewhere(installed, tmp_path):
  proc = _run(["-m", "iclr24_jax.launch", "reproduce", "--only", "safeguards", "--fast", "--out",
               str(tmp_path / "out"), "--workdir", str(tmp_path / "runs")], installed, tmp_path)
  assert proc.returncode == 0, (proc.stdout[-1500:], proc.stderr[-3000:])
  table = (tmp_path / "out" / "REPRODUCTION.md").read_text()
  assert "| safeguards |" in table and "(failed)" not in table
