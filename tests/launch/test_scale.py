"""The `iclr24 scale` command (`iclr24_jax.launch.scale`): its rows at 64 simulated devices from a subprocess, the
merge of a rerun's rows into results/scale/<slug>.json, and one row per data set of a paper's SCALE_VARIANTS."""
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from iclr24_jax import registry
from iclr24_jax.common import scale
from iclr24_jax.launch import scale as scale_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_sixty_four_devices_in_a_subprocess_hold_less_per_device(tmp_path):
  rows_path = tmp_path / "rows.json"
  subprocess.run([sys.executable, "-m", "experiments.scale", "--devices", "64", "--only", "cpm", "--rows-out",
                  str(rows_path)], check=True, cwd=ROOT, timeout=900)
  (row64,) = json.loads(rows_path.read_text())
  config = importlib.import_module("iclr24_jax.configs.cpm").get_config("paper")
  mesh = scale.mesh_for(8, int(config.scale.batch_size))
  row8 = scale.analyse(registry.study_module("cpm").scale_program(config, mesh), mesh)
  assert row64["devices"] == 64 and row64["mesh"] == "data=64,model=1"
  np.testing.assert_allclose(row64["param_bytes"], row8["param_bytes"] / 8, rtol=0.01)
  assert row64["peak_bytes"] < row8["peak_bytes"] / 4


def test_merge_rows_replaces_the_same_program_devices_and_mesh(tmp_path):
  path = tmp_path / "x.json"
  path.write_text(json.dumps([{"program": "p", "devices": 8, "mesh": "data=8,model=1", "flops": 1.0},
                              {"program": "p", "devices": 64, "mesh": "data=64,model=1", "flops": 2.0}]))
  rows = scale_cli.merge_rows(str(path), [{"program": "p", "devices": 8, "mesh": "data=8,model=1", "flops": 3.0}])
  assert [(r["devices"], r["flops"]) for r in rows] == [(8, 3.0), (64, 2.0)]


def test_scale_variants_give_each_data_set_a_row_the_command_line_can_regenerate():
  assert scale_cli.scale_variants("pmp") == ("paper", "paper,amazon", "paper,tfinance")
  assert scale_cli.scale_variants("cdgm") == ("paper",)
  names = [scale_cli.paper_entry("pmp", v)[0].data.name for v in scale_cli.scale_variants("pmp")]
  assert names == ["yelpchi", "amazon", "tfinance"]
  for slug in registry.PAPERS:
    variants = scale_cli.scale_variants(slug)
    with open(os.path.join(ROOT, "results", "scale", f"{slug}.json")) as f:
      programs = {row["program"] for row in json.load(f) if row["devices"] == 8}
    assert len(programs) >= len(variants), (slug, variants, programs)
