"""C-DGM study (`papers/cdgm/study.py`): the side-by-side with PiShield, the official constraint layer."""
import importlib

import pytest

from iclr24_jax.common import bench
from iclr24_jax.papers.cdgm import data as data_lib
from iclr24_jax.papers.cdgm import study


def test_pishield_missing_says_how_to_install(monkeypatch):
  real = importlib.import_module

  def no_pishield(name, *args, **kwargs):
    if name.startswith("pishield"):
      raise ImportError("No module named 'pishield'")
    return real(name, *args, **kwargs)

  monkeypatch.setattr(bench.importlib, "import_module", no_pishield)
  why = study._pishield_or_reason()
  assert "ImportError" in why and "'bench' extra" in why and "pip install pishield" in why


def test_layer_matches_pishield_on_the_generated_constraints():
  if study._pishield_or_reason() is not None:
    pytest.skip(study._pishield_or_reason())
  cons = data_lib.load_generated().constraints
  row = study.layer_vs_pishield("generated", cons, data_lib.GENERATED_CONSTRAINTS, batch=64, repeats=2)
  # The same layer: the official one agrees with ours to float32 rounding on this set, and both satisfy it.
  assert row["both_satisfy"] and row["max_abs_diff"] < 1e-4, row
  assert row["ratio"] > 0 and row["peer"].startswith("PiShield")
