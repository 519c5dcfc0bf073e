"""Timing compiled functions: compile seconds, median step time, items/s, memory; tables and JSON."""
from __future__ import annotations

import importlib
import json
import os
import resource
import statistics
import time
from typing import Any, Callable, Sequence

import jax


def _block(x):
  return jax.block_until_ready(x)


def peak_memory_bytes() -> dict[str, int | None]:
  """Peak device memory where the backend reports it (GPU/TPU), else None; and host peak RSS."""
  device_peak = None
  try:
    stats = jax.devices()[0].memory_stats()
    if stats:
      device_peak = int(stats.get("peak_bytes_in_use", stats.get("bytes_in_use", 0)))
  except Exception:
    device_peak = None
  host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  return {"device_peak_bytes": device_peak, "host_peak_rss_bytes": int(host_peak)}


def time_fn(fn: Callable, *args: Any, repeats: int = 10, warmup: int = 1, items: int | None = None,
            carry: bool = False, name: str = "", min_time_s: float = 0.0, **extra: Any) -> dict[str, Any]:
  """Times a function; jitted functions are lowered and compiled separately to time compilation.

  Args:
    fn: a `jax.jit`-wrapped function (or any callable returning arrays).
    *args: its arguments.
    repeats: timed calls (the median is reported).
    warmup: untimed calls after compilation.
    items: work items per call (examples, tokens, env steps) for items/s.
    carry: feed the first output back as the first argument (for steps that donate their state).
    name: a row label.
    min_time_s: keep repeating until this much time was measured (noisy machines).
    **extra: more columns for the row (size, devices ...).

  Returns:
    A row: name, compile_s, median_s, steps_per_s, items_per_s, compiled_temp_bytes, peak memory, extra.
  """
  compile_s = None
  temp_bytes = None
  call = fn
  if hasattr(fn, "lower"):
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    try:
      ma = compiled.memory_analysis()
      temp_bytes = int(ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes)
    except Exception:
      temp_bytes = None
    call = compiled
  args = list(args)

  def once():
    out = _block(call(*args))
    if carry:
      args[0] = out[0] if isinstance(out, tuple) else out
    return out

  for _ in range(warmup):
    once()
  times = []
  t_start = time.perf_counter()
  while len(times) < repeats or (time.perf_counter() - t_start) < min_time_s:
    t0 = time.perf_counter()
    once()
    times.append(time.perf_counter() - t0)
    if len(times) > 10 * max(repeats, 1):
      break
  med = statistics.median(times)
  row = {"name": name, "compile_s": compile_s, "median_s": med, "steps_per_s": 1.0 / med if med > 0 else None,
         "items_per_s": (items / med if items and med > 0 else None), "repeats": len(times),
         "compiled_bytes": temp_bytes, "devices": jax.device_count(), "backend": jax.default_backend()}
  row.update(peak_memory_bytes())
  row.update(extra)
  return row


def time_host(fn: Callable[[], Any], repeats: int = 3, items: int | None = None, name: str = "", **extra) -> dict:
  """Times a whole host-side routine (first call reported separately as it includes compilation).

  Each call's outputs are blocked on (jax.block_until_ready) before the clock stops.

  Args:
    fn: zero-argument callable to time.
    repeats: timed calls after the first (0: median_s is the first call's time).
    items: items processed per call (for items_per_s), or None.
    name: the row's name.
    **extra: more columns copied into the row.

  Returns:
    row dict: name, first_call_s, median_s, steps_per_s, items_per_s, repeats, devices, backend, the peak
    memory columns of `peak_memory_bytes()` and `extra`.
  """
  t0 = time.perf_counter()
  _block(fn())
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    _block(fn())
    times.append(time.perf_counter() - t0)
  med = statistics.median(times) if times else first
  row = {"name": name, "first_call_s": first, "median_s": med, "steps_per_s": 1.0 / med if med > 0 else None,
         "items_per_s": (items / med if items and med > 0 else None), "repeats": len(times),
         "devices": jax.device_count(), "backend": jax.default_backend()}
  row.update(peak_memory_bytes())
  row.update(extra)
  return row


def peer_unavailable(module: str, install_hint: str) -> str | None:
  """Why a peer a benchmark times beside ours cannot run here, or None when its module imports.

  Args:
    module: the peer's importable module (e.g. 'llama_cpp').
    install_hint: how to install it, appended to the reason.

  Returns:
    None, or "<module> does not import (<error>); <install_hint>" (an ImportError, or a shared library failing
    to load).
  """
  try:
    importlib.import_module(module)
  except Exception as e:  # noqa: BLE001  (any failure to load is a reason, reported, never hidden)
    return f"{module} does not import ({type(e).__name__}: {str(e)[:160]}); {install_hint}"
  return None


def alternate(fns: Sequence[Callable[[], Any]], repeats: int, once_over_s: float | None = None) -> list[dict]:
  """Times several zero-argument routines side by side, one call of each per round, `repeats` rounds.

  Alternating calls lets a change of machine load hit every side alike. Each call's outputs are blocked on
  (jax.block_until_ready) before the clock stops. A routine whose first timed call takes longer than
  `once_over_s` is timed once (a slow peer); the others every round.

  Args:
    fns: the routines, each already warm (compiled / built).
    repeats: rounds.
    once_over_s: above this a routine is not called again after the first round (None: always).

  Returns:
    one dict per routine: wall [n] and cpu [n] (process CPU) seconds, median_s and cpu_s (their medians).
  """
  out = [{"wall": [], "cpu": []} for _ in fns]
  for r in range(repeats):
    for fn, o in zip(fns, out):
      if r > 0 and once_over_s is not None and o["wall"][0] > once_over_s:
        continue
      t0, c0 = time.perf_counter(), time.process_time()
      _block(fn())
      o["wall"].append(time.perf_counter() - t0)
      o["cpu"].append(time.process_time() - c0)
  for o in out:
    o["median_s"], o["cpu_s"] = statistics.median(o["wall"]), statistics.median(o["cpu"])
  return out


def _fmt(v: Any) -> str:
  if v is None:
    return "-"
  if isinstance(v, float):
    if v == 0:
      return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
      return f"{v:.3g}"
    return f"{v:.4g}"
  return str(v)


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
  r"""Formats rows as a Markdown table (columns default to the union of keys, in first-seen order).

  Args:
    rows: dicts of cell values (missing / None cells print '-'; floats 4 significant digits, 3 when tiny or huge).
    columns: column names to show, in order, or None.

  Returns:
    the table as a string ending in a newline ('(no rows)\n' for no rows).
  """
  if not rows:
    return "(no rows)\n"
  if columns is None:
    columns = []
    for r in rows:
      for k in r:
        if k not in columns:
          columns.append(k)
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for r in rows:
    lines.append("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
  return "\n".join(lines) + "\n"


def write_rows(rows: Sequence[dict], path_json: str, path_md: str | None = None,
               columns: Sequence[str] | None = None) -> None:
  """Writes rows as JSON (and a Markdown table).

  Args:
    rows: dicts (non-JSON values are written with str()).
    path_json: JSON output path (folders created).
    path_md: optional Markdown output path for `format_table(rows, columns)` (its folder must exist).
    columns: the Markdown table's columns (see `format_table`).
  """
  os.makedirs(os.path.dirname(os.path.abspath(path_json)), exist_ok=True)
  with open(path_json, "w") as f:
    json.dump(list(rows), f, indent=2, default=str)
  if path_md:
    with open(path_md, "w") as f:
      f.write(format_table(rows, columns))


def device_counts(max_devices: int | None = None) -> list[int]:
  """The mesh sizes a benchmark compares: 1 and every available device (once each when there is one device)."""
  n = jax.device_count() if max_devices is None else min(max_devices, jax.device_count())
  return sorted({1, n})


def across_devices(make_case: Callable[[Any, int], tuple[Callable, tuple, dict]], *, sizes: Sequence[Any] = (None,),
                   counts: Sequence[int] | None = None, **time_kw: Any) -> list[dict]:
  """Times one compiled function on a 1-device mesh and on all devices, for each size: the loop every paper's
  `benchmark()` needs, written once.

  Args:
    make_case: `(mesh, size) -> (fn, args, columns)`: builds the jitted function for this mesh (its state
      replicated or sharded as the method does), its arguments (batches already sharded with
      `sharding.shard_batch`), and extra row columns (name, size label, batch, items ...). `columns` may hold
      `items` and `name`; any other key becomes a column.
    sizes: the problem sizes to sweep (passed through to make_case).
    counts: mesh sizes (default `device_counts()`).
    **time_kw: passed to `time_fn` (repeats, carry, warmup, min_time_s ...).

  Returns:
    One row per (size, device count), each with `mesh_devices`.
  """
  from iclr24_jax.common import sharding  # local: bench is imported by code that sets up devices first
  rows = []
  for size in sizes:
    for mesh in sharding.device_meshes(device_counts() if counts is None else counts):
      with jax.set_mesh(mesh):
        fn, args, columns = make_case(mesh, size)
        rows.append(time_fn(fn, *args, mesh_devices=mesh.devices.size, **{**time_kw, **dict(columns)}))
  return rows
