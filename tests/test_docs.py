"""The API reference builds from the docstrings with no warning (`mkdocs build --strict`), as CI requires."""
import importlib.util
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _griffe_args():
  spec = importlib.util.spec_from_file_location("griffe_args", ROOT / "docs" / "griffe_args.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_shared_description_lines_become_one_entry_per_name():
  text = ("Scores.\n\nArgs:\n  params, config: the model.\n  x (int): one,\n    see_a, see_b: a continuation.\n\n"
          "Returns:\n  a, b: not an Args section, kept.")
  got = _griffe_args().split_multi_args(text)
  assert got == ("Scores.\n\nArgs:\n  params: the model.\n  config: the model.\n  x (int): one,\n"
                 "    see_a, see_b: a continuation.\n\nReturns:\n  a, b: not an Args section, kept.")


def test_api_reference_builds_strict(tmp_path):
  site = tmp_path / "site"
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  page = (site / "papers" / "pmp" / "index.html").read_text()
  assert "partition_messages" in page and "Partitioning Message Passing" in page
  assert (site / "families" / "common" / "index.html").is_file()
