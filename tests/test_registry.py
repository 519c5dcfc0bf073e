"""Every registered experiment's modules import, and name what the main job and the benchmark call.

Moving code between a paper's modules can leave a study calling a name that no longer lives where it
looks; these checks catch it without running the (long) studies: each study module imports and exposes
`reproduce(workdir, fast=...)` and `benchmark(quick=...)`, the runners hand them their configs, and the library
has no undefined names (pyflakes, when installed).
"""
import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest

from iclr24_jax import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", registry.available())
def test_study_module_has_reproduce_and_benchmark(name):
  module = registry.study_module(name)
  assert callable(getattr(module, "reproduce", None)), f"{module.__name__} has no reproduce()"
  params = inspect.signature(module.reproduce).parameters
  assert "workdir" in params and "fast" in params, f"{module.__name__}.reproduce{inspect.signature(module.reproduce)}"
  if hasattr(module, "benchmark"):
    assert "quick" in inspect.signature(module.benchmark).parameters


def test_every_paper_package_is_registered():
  papers = os.path.join(ROOT, "iclr24_jax", "papers")
  slugs = sorted(d for d in os.listdir(papers) if os.path.isdir(os.path.join(papers, d)) and not d.startswith("_"))
  missing = [s for s in slugs if s not in registry.available()]
  assert not missing, f"paper packages without an experiment module: {missing}"
  assert len(slugs) == 19


@pytest.mark.skipif(importlib.util.find_spec("pyflakes") is None, reason="pyflakes is not installed")
def test_no_undefined_names_in_the_library():
  out = subprocess.run([sys.executable, "-m", "pyflakes", os.path.join(ROOT, "iclr24_jax"),
                        os.path.join(ROOT, "experiments")], capture_output=True, text=True).stdout
  bad = [line for line in out.splitlines() if "undefined name" in line or "import *" in line]
  assert not bad, "\n".join(bad)


def test_extended_studies_resolve_and_stay_out_of_the_main_job():
  for name in registry.extended():
    paper, _ = registry.EXTENDED[name]
    assert paper in registry.available() and name not in registry.available()
    assert callable(registry.reproduce_fn(name))
  assert registry.reproduce_fn("mario") is registry.study_module("mario").reproduce


@pytest.mark.parametrize("paper", ["lm_inversion", "daclip", "mdm"])
def test_heavy_studies_run_by_name_and_the_main_job_runs_their_one_seed_miniature(paper):
  """The full 3-seed study runs as `<paper>_seeds` (outside the main job); the main job's `<paper>` runs the same
  study on the config's 'one_seed' variant."""
  module = registry.study_module(paper)
  assert f"{paper}_seeds" in registry.extended() and paper in registry.available()
  assert registry.reproduce_fn(f"{paper}_seeds") is module.reproduce_seeds
  assert registry.reproduce_fn(paper) is module.reproduce
  full, mini = registry.config_factory(paper)(""), registry.config_factory(paper)("one_seed")
  seeds = {"lm_inversion": lambda c: len(c.seeds), "daclip": lambda c: (c.num_seeds, c.controller.seeds),
           "mdm": lambda c: len(c.repro.seeds)}[paper]
  assert seeds(full) in (3, (3, 3)) and seeds(mini) in (1, (1, 1))


def test_runners_pass_each_study_its_packaged_get_config():
  """Configs are data the library never imports: the runners hand a study function the experiment's
  packaged `get_config` exactly when it declares the keyword."""
  for name in registry.available() + registry.extended():
    get_config = registry.config_factory(name)
    assert callable(get_config) and get_config("tiny") is not None
    fn = registry.reproduce_fn(name)
    declared = "get_config" in inspect.signature(fn).parameters
    assert registry.study_kwargs(fn, name) == ({"get_config": get_config} if declared else {})
  with pytest.raises(ValueError, match="no packaged config"):
    registry.config_factory("no_such_paper")


def test_no_library_module_imports_a_config():
  """The library receives configs; configs import nothing from the library (presets are data in them)."""
  lib = os.path.join(ROOT, "iclr24_jax")
  for folder, _, files in os.walk(lib):
    for f in files:
      if not f.endswith(".py"):
        continue
      path = os.path.join(folder, f)
      with open(path) as fh:
        text = fh.read()
      if os.path.relpath(folder, lib).startswith("configs"):
        assert not re.search(r"^\s*(from|import) iclr24_jax\.(?!configs)", text, re.M), path
      else:
        assert not re.search(r"^\s*from iclr24_jax\.configs import|^\s*import iclr24_jax\.configs", text, re.M), path


def test_unknown_experiment_is_named():
  with pytest.raises(ValueError, match="unknown experiment"):
    registry.experiment_module("nope")
