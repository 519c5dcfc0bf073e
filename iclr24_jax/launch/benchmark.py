"""Times each registered experiment's compiled step or core routine and writes a table.

  iclr24 benchmark                # everything, quick sizes, 8 simulated CPU devices
  iclr24 benchmark --only classify --full
  iclr24 benchmark --devices 1    # no device simulation (e.g. on one GPU)

  iclr24 benchmark --only cpm --keep   # rerun one; keep the others' saved rows
  iclr24 benchmark --table        # run nothing; rebuild the table from results/bench/*.json

Rows: name, sizes, devices, compile seconds, median step seconds, steps/s, items/s, compiled memory
and peak memory. Each experiment's rows are saved in results/bench/<name>.json (committed); all of them are
written to results/BENCHMARK.md and results/benchmark.json.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

# The folder holding the `iclr24_jax` package: a checkout's root, or site-packages for an installed copy.
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A checkout (setup.py beside iclr24_jax/) writes into itself; an installed copy writes under the current directory.
ROOT = _HERE if os.path.exists(os.path.join(_HERE, "setup.py")) else os.getcwd()
COLUMNS = ["name", "size", "batch", "mesh_devices", "compile_s", "first_call_s", "median_s", "peer", "peer_median_s",
           "ratio", "steps_per_s", "items_per_s", "compiled_bytes", "device_peak_bytes", "host_peak_rss_bytes",
           "backend"]


# Columns kept out of the per-experiment tables: bookkeeping that the summary shows once, or repeats every row.
_HIDDEN = {"experiment", "repeats", "devices", "backend", "measured_at", "load"}


def _filled(rows: list[dict], column: str) -> bool:
  return any(r.get(column) is not None for r in rows)


def _by_filled_columns(rows: list[dict]) -> list[list[dict]]:
  """Rows grouped by the columns they fill (first-seen order): one table each, so no table has an empty column
  and no row an empty cell (an experiment's routines report different quantities)."""
  groups: dict[frozenset, list[dict]] = {}
  for r in rows:
    groups.setdefault(frozenset(k for k, v in r.items() if v is not None and k not in _HIDDEN), []).append(r)
  return list(groups.values())


def _load_of(row: dict) -> float | None:
  """The 1-minute load average a row was measured under: its 'load' column, or one its notes quote."""
  import re
  if row.get("load") is not None:
    return float(row["load"])
  m = re.search(r"load average (?:of )?([0-9]+(?:\.[0-9]+)?)", str(row.get("notes", "")))
  return float(m.group(1)) if m else None


def _measured_on(exp: str, rows: list[dict], bench_dir: str | None) -> str:
  """When an experiment's rows were measured: their 'measured_at', else the last commit of its saved JSON."""
  stamps = sorted(str(r["measured_at"])[:10] for r in rows if r.get("measured_at"))
  if stamps:
    return stamps[-1]
  if bench_dir is None:
    return "unknown"
  import subprocess
  try:
    out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", f"{exp}.json"], cwd=bench_dir,
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or "unknown"
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def headline(rows: list[dict]) -> dict:
  """The row an experiment's summary quotes: the largest-size row of its first comparison with a peer (the
  official code or the library a user would pick instead), else of its first timed routine, on one device.

  Args:
    rows: one experiment's rows, in the order its benchmark wrote them.

  Returns:
    the row (the last of that routine's one-device rows: sizes are swept small to large).
  """
  timed = [r for r in rows if r.get("median_s") is not None or r.get("items_per_s") is not None]
  pool = [r for r in timed if r.get("ratio") is not None] or timed or rows
  name = pool[0].get("name")
  same = [r for r in pool if r.get("name") == name]
  one = [r for r in same if r.get("mesh_devices") in (None, 1)] or same
  return one[-1]


def _throughput(row: dict) -> str:
  from iclr24_jax.common import bench
  if row.get("items_per_s") is not None:
    return f"{bench._fmt(row['items_per_s'])} items/s"
  if row.get("steps_per_s") is not None:
    return f"{bench._fmt(row['steps_per_s'])} calls/s"
  if row.get("median_s") is not None:
    return f"{bench._fmt(row['median_s'])} s per call"
  return "-"


def summary_rows(rows: list[dict], bench_dir: str | None = None) -> list[dict]:
  """One row per experiment: paper, headline routine (`headline`), throughput, vs official, measured when.

  Args:
    rows: every experiment's rows (with 'experiment').
    bench_dir: results/bench, whose git history dates rows saved without 'measured_at' (None: not looked up).

  Returns:
    rows with the summary table's columns.
  """
  from iclr24_jax.common import bench
  out = []
  for exp in dict.fromkeys(r.get("experiment", "?") for r in rows):
    sub = [r for r in rows if r.get("experiment", "?") == exp]
    top = headline(sub)
    size = ", ".join(f"{k} {top[k]}" for k in ("size", "batch") if top.get(k) is not None)
    if top.get("ratio") is not None:
      peer = top.get("peer") or ("llama.cpp" if top.get("llamacpp_items_per_s") is not None else "peer")
      vs = f"{bench._fmt(float(top['ratio']))}x ({peer} time / ours)"
    else:
      vs = "no comparison measured"
    loads = [x for x in (_load_of(r) for r in sub) if x is not None]
    when = _measured_on(exp, sub, bench_dir)
    out.append({"paper": exp, "headline routine": f"{top.get('name', '?')}" + (f" [{size}]" if size else ""),
                "throughput": _throughput(top), "vs official (ratio)": vs,
                "measured when": when + (f" (load {max(loads):.1f})" if loads else " (load not recorded)")})
  return out


def write_markdown(rows: list[dict], path: str, devices: int | None = None, bench_dir: str | None = None) -> str:
  """The summary table, then each experiment's rows in tables of the columns they fill (`_by_filled_columns`).

  Args:
    rows: every experiment's rows (with 'experiment').
    path: the Markdown file to write.
    devices: the simulated CPU devices of this run (for the preamble).
    bench_dir: results/bench (dates rows saved without 'measured_at', from git).

  Returns:
    path.
  """
  from iclr24_jax.common import bench
  lines = ["# Benchmarks", "",
           f"Tables rebuilt by `iclr24 benchmark` on {datetime.date.today().isoformat()}"
           + (f" with {devices} simulated CPU devices" if devices and devices > 1 else "")
           + "; each experiment's rows were measured when the summary says, under the 1-minute load average shown "
           "(the machine is shared; a high load slows every time in the row). Times are medians after compilation; "
           "`mesh_devices` is the mesh the step ran on. On a CPU the simulated devices share the same cores, so "
           "8-device rows show that the sharded step compiles and runs, not a speed-up; compare sizes and ratios, not "
           "single times. The persistent compilation cache is on (`iclr24_jax.common.compile_cache`): in a rerun "
           "`compile_s` is the time to load the compiled program (ICLR24_JAX_COMPILATION_CACHE=0 measures "
           "compilation). `ratio` = a peer's time / ours on the same inputs in the same run (peer = the official code "
           "or the library a user would pick instead; > 1: ours is faster).", "",
           "## Summary", "",
           "The headline routine is the largest size of an experiment's first comparison with a peer, else of its "
           "first timed routine, on one device. Below it, each experiment's rows are grouped into tables by the "
           "columns they fill, so no cell is empty.", "",
           bench.format_table(summary_rows(rows, bench_dir)).rstrip(), ""]
  for exp in dict.fromkeys(r.get("experiment", "?") for r in rows):
    lines += [f"## {exp}", ""]
    for group in _by_filled_columns([r for r in rows if r.get("experiment", "?") == exp]):
      cols = [c for c in COLUMNS if c not in _HIDDEN and _filled(group, c)]
      extra = [k for k in dict.fromkeys(k for r in group for k in r)
               if k not in cols and k not in COLUMNS and k not in _HIDDEN and _filled(group, k)]
      lines += [bench.format_table(group, cols + extra).rstrip(), ""]
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def main(argv: list[str] | None = None) -> int:
  """The command line (`iclr24 benchmark ...`); returns the exit code."""
  parser = argparse.ArgumentParser(prog="iclr24 benchmark", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", default="")
  parser.add_argument("--skip", default="")
  parser.add_argument("--full", action="store_true", help="larger sizes and more repeats")
  parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices (CPU backend only)")
  parser.add_argument("--out", default=os.path.join(ROOT, "results"))
  parser.add_argument("--keep", action="store_true",
                      help="keep the rows of experiments not run now (results/bench/<name>.json)")
  parser.add_argument("--table", action="store_true", help="run nothing; rebuild the table from results/bench")
  args = parser.parse_args(argv)
  sys.path.insert(0, _HERE)
  from iclr24_jax.common.sharding import simulate_cpu_devices
  if args.devices > 1:
    simulate_cpu_devices(args.devices)  # only affects the CPU backend
  from iclr24_jax.common.compile_cache import enable_compilation_cache
  enable_compilation_cache()  # compile_s of a cached program is its load time (ICLR24_JAX_COMPILATION_CACHE=0: off)
  from iclr24_jax import registry
  from iclr24_jax.common import bench
  names = [n for n in registry.available() if (not args.only or n in args.only.split(","))
           and n not in args.skip.split(",")]
  rows, failures = [], []
  bench_dir = os.path.join(args.out, "bench")
  if args.table:
    names, args.keep = [], True
  for name in names:
    module = registry.study_module(name)
    if not hasattr(module, "benchmark"):
      continue
    print(f"=== {name} ===", flush=True)
    t0 = time.time()
    stamp, load = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), os.getloadavg()[0]
    try:
      new = module.benchmark(quick=not args.full, **registry.study_kwargs(module.benchmark, name))
    except Exception as e:  # keep going; report the failure in the table
      failures.append(name)
      new = [{"name": f"{name} (failed: {type(e).__name__}: {str(e)[:120]})"}]
    for r in new:
      r.setdefault("experiment", name)
      r.setdefault("measured_at", stamp)   # the summary's 'measured when' and load (a study's own load wins)
      r.setdefault("load", round(load, 2))
    rows.extend(new)
    if name not in failures:
      os.makedirs(bench_dir, exist_ok=True)
      bench.write_rows(new, os.path.join(bench_dir, f"{name}.json"))
    print(bench.format_table(new, [c for c in COLUMNS if any(c in r for r in new)]), flush=True)
    print(f"--- {name} ({time.time() - t0:.0f}s)", flush=True)
  if args.keep:
    import json
    ran = set(names)
    order = {n: i for i, n in enumerate(registry.available())}
    old = []
    for other in registry.available():
      path = os.path.join(bench_dir, f"{other}.json")
      if other not in ran and os.path.exists(path):
        with open(path) as f:
          saved = json.load(f)
        old += saved.get("rows", saved) if isinstance(saved, dict) else saved
    rows = sorted(old + rows, key=lambda r: order.get(r.get("experiment"), len(order)))
  bench.write_rows(rows, os.path.join(args.out, "benchmark.json"))
  path = write_markdown(rows, os.path.join(args.out, "BENCHMARK.md"), args.devices, bench_dir)
  print(f"wrote {path}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
