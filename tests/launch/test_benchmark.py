"""BENCHMARK.md: a summary table first, then tables with only the columns their rows fill."""
from iclr24_jax.launch import benchmark


def _rows():
  common = {"devices": 8, "backend": "cpu", "repeats": 3}
  return [
      {"experiment": "a", "name": "a/step", "size": 8, "mesh_devices": 1, "median_s": 0.5, "items_per_s": 16.0,
       "device_peak_bytes": None, **common},
      {"experiment": "a", "name": "a/step", "size": 32, "mesh_devices": 1, "median_s": 1.0, "items_per_s": 32.0,
       "device_peak_bytes": None, **common},
      {"experiment": "a", "name": "a/step", "size": 32, "mesh_devices": 8, "median_s": 2.0, "items_per_s": 16.0,
       "device_peak_bytes": None, **common},
      {"experiment": "a", "name": "a/bandwidth", "read_gb_s": 5.5, "mesh_devices": 1, **common},
      {"experiment": "b", "name": "b/fit", "size": 100, "mesh_devices": 1, "median_s": 0.25, "steps_per_s": 4.0,
       "measured_at": "2026-11-30T10:00:00+00:00", "load": 3.25, **common},
      {"experiment": "b", "name": "b/vs_official", "size": 10, "mesh_devices": 1, "median_s": 0.1, "peer": "official",
       "peer_median_s": 1.5, "ratio": 15.0, "notes": "1-min load average 12.5", **common},
      {"experiment": "b", "name": "b/vs_official", "size": 1000, "mesh_devices": 1, "median_s": 2.0, "peer": "official",
       "peer_median_s": 8.0, "ratio": 4.0, **common},
  ]


def test_headline_prefers_the_largest_peer_comparison_on_one_device():
  rows = _rows()
  assert benchmark.headline([r for r in rows if r["experiment"] == "a"])["size"] == 32      # the 8-device row: no
  top = benchmark.headline([r for r in rows if r["experiment"] == "b"])
  assert (top["name"], top["size"]) == ("b/vs_official", 1000)


def test_summary_rows_quote_throughput_ratio_date_and_load():
  a, b = benchmark.summary_rows(_rows())
  assert a == {"paper": "a", "headline routine": "a/step [size 32]", "throughput": "32 items/s",
               "vs official (ratio)": "no comparison measured", "measured when": "unknown (load not recorded)"}
  # b: ratio 4 = 8.0 s / 2.0 s at size 1000 (no items or steps/s recorded: its median time); the highest load of its rows (3.25 recorded, 12.5 quoted in notes)
  assert b == {"paper": "b", "headline routine": "b/vs_official [size 1000]", "throughput": "2 s per call",
               "vs official (ratio)": "4x (official time / ours)", "measured when": "2026-11-30 (load 12.5)"}


def test_tables_show_only_filled_columns(tmp_path):
  path = benchmark.write_markdown(_rows(), str(tmp_path / "BENCHMARK.md"), devices=8)
  text = open(path).read()
  assert text.index("## Summary") < text.index("## a") < text.index("## b")
  tables = [block for block in text.split("\n\n") if block.startswith("| name |")]
  assert len(tables) == 5       # a: step, bandwidth; b: fit, vs_official with notes, vs_official without
  for table in tables:
    header, _, *body = table.strip().splitlines()
    assert body and all("| - |" not in line and not line.endswith("| - |") for line in body)
    assert "device_peak_bytes" not in header and "backend" not in header and "load" not in header
  assert tables[1].splitlines()[0] == "| name | mesh_devices | read_gb_s |"
