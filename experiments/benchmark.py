"""Times each registered experiment's compiled step or core routine and writes a table.

  python -m experiments.benchmark                # everything, quick sizes, 8 simulated CPU devices
  python -m experiments.benchmark --only classify --full
  python -m experiments.benchmark --devices 1    # no device simulation (e.g. on one GPU)

Rows: name, sizes, devices, compile seconds, median step seconds, steps/s, items/s, compiled memory
and peak memory. Written to results/BENCHMARK.md and results/benchmark.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ["name", "size", "batch", "mesh_devices", "compile_s", "median_s", "steps_per_s", "items_per_s",
           "compiled_bytes", "device_peak_bytes", "host_peak_rss_bytes", "backend"]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", default="")
  parser.add_argument("--skip", default="")
  parser.add_argument("--full", action="store_true", help="larger sizes and more repeats")
  parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices (CPU backend only)")
  parser.add_argument("--out", default=os.path.join(ROOT, "results"))
  parser.add_argument("--keep", action="store_true",
                      help="keep the rows of experiments not run now from the existing <out>/benchmark.json")
  args = parser.parse_args()
  sys.path.insert(0, ROOT)
  from iclr24_jax.common.sharding import simulate_cpu_devices
  if args.devices > 1:
    simulate_cpu_devices(args.devices)  # only affects the CPU backend
  from iclr24_jax import registry
  from iclr24_jax.common import bench
  names = [n for n in registry.available() if (not args.only or n in args.only.split(","))
           and n not in args.skip.split(",")]
  rows, failures = [], []
  for name in names:
    module = registry.experiment_module(name)
    if not hasattr(module, "benchmark"):
      continue
    print(f"=== {name} ===", flush=True)
    t0 = time.time()
    try:
      new = module.benchmark(quick=not args.full)
    except Exception as e:  # keep going; report the failure in the table
      failures.append(name)
      new = [{"name": f"{name} (failed: {type(e).__name__}: {str(e)[:120]})"}]
    for r in new:
      r.setdefault("experiment", name)
    rows.extend(new)
    print(bench.format_table(new, [c for c in COLUMNS if any(c in r for r in new)]), flush=True)
    print(f"--- {name} ({time.time() - t0:.0f}s)", flush=True)
  saved = os.path.join(args.out, "benchmark.json")
  if args.keep and os.path.exists(saved):
    import json
    with open(saved) as f:
      old = json.load(f)
    old = old.get("rows", old) if isinstance(old, dict) else old
    ran = set(names)
    order = {n: i for i, n in enumerate(registry.available())}
    rows = sorted([r for r in old if r.get("experiment") not in ran] + rows,
                  key=lambda r: order.get(r.get("experiment"), len(order)))
  cols = [c for c in COLUMNS if any(c in r for r in rows)]
  extra = sorted({k for r in rows for k in r} - set(cols) - {"experiment", "repeats", "devices"})
  bench.write_rows(rows, os.path.join(args.out, "benchmark.json"), os.path.join(args.out, "BENCHMARK.md"),
                   columns=cols + extra)
  print(f"wrote {os.path.join(args.out, 'BENCHMARK.md')}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
