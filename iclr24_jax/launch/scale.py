"""Every paper at its own size, compiled ahead of time: results/SCALE.md and results/scale/<slug>.json.

  iclr24 scale                          # every paper with a `paper` config, at 8 and 64 devices
  iclr24 scale --only finetune_dissect  # one paper (comma-separated for several)
  iclr24 scale --only pmp               # every variant in configs/pmp.py:SCALE_VARIANTS (one row per data set)
  iclr24 scale --devices 8 --mesh 2,4   # one device count in this process, an explicit mesh
  iclr24 scale --run --steps 10         # on an accelerator: also run each step on random inputs
  iclr24 scale --table                  # run nothing; rebuild SCALE.md from results/scale
(from a checkout, `python -m experiments.scale ...` is the same command)

For each paper whose `configs/<slug>.py` has a `paper` variant and whose study module has `scale_program(config,
mesh)`, the program is lowered and compiled on abstract sharded inputs over simulated CPU devices
(`common.scale.analyse`: per-device memory, FLOPs, compile time, roofline step time on an H100 and a TPU v5e).
Without --devices each device count runs in its own subprocess (the number of simulated devices is fixed when
JAX starts). Rows are merged into results/scale/<slug>.json (a row with the same program, devices and mesh is
replaced); SCALE.md is rebuilt from all of them.

--run uses the devices JAX finds (no simulation) and adds measured_steps_per_s (and the compile time and peak
memory of the real run) to that device count's row; rows never run say 'not run'.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A checkout (setup.py beside the package) writes into itself; an installed copy writes under the current directory.
ROOT = _HERE if os.path.exists(os.path.join(_HERE, "setup.py")) else os.getcwd()
DEFAULT_DEVICES = (8, 64)
KEY_FIELDS = ("program", "devices", "mesh")


def _slugs(only: str) -> list[str]:
  from iclr24_jax import registry
  wanted = [s for s in only.split(",") if s]
  unknown = [s for s in wanted if s not in registry.PAPERS]
  if unknown:
    raise SystemExit(f"unknown paper(s) {unknown}; choose from {list(registry.PAPERS)}.")
  return wanted or list(registry.PAPERS)


def scale_variants(slug: str) -> tuple[str, ...]:
  """The config variants `iclr24 scale` compiles for `slug`: the config module's `SCALE_VARIANTS`, else ('paper',).

  A paper evaluated on several data sets at different sizes lists one variant per data set (pmp:
  `('paper', 'paper,amazon', 'paper,tfinance')`), so each graph's row can be regenerated from the command line.
  """
  import importlib
  cfg_mod = importlib.import_module(f"iclr24_jax.configs.{slug}")
  return tuple(getattr(cfg_mod, "SCALE_VARIANTS", ("paper",)))


def paper_entry(slug: str, variant: str = "paper"):
  """(config, study module) of a paper with a `paper` variant and `scale_program`, or (None, reason)."""
  import importlib
  from iclr24_jax import registry
  try:
    cfg_mod = importlib.import_module(f"iclr24_jax.configs.{slug}")
    config = cfg_mod.get_config(variant)
  except ValueError:
    return None, f"no {variant!r} config variant yet"
  study = registry.study_module(slug)
  if not hasattr(study, "scale_program"):
    return None, "no scale_program in its study module yet"
  return config, study


def analyse_papers(slugs: list[str], mesh_shape: tuple[int, int] | None, run: bool, steps: int) -> list[dict]:
  """Rows for `slugs` on the devices of this process (simulated or real)."""
  import jax
  from iclr24_jax.common import scale
  devices = jax.device_count()
  rows = []
  for slug, variant in ((s, v) for s in slugs for v in scale_variants(s)):
    config, study = paper_entry(slug, variant)
    if config is None:
      print(f"--- {slug}:{variant}: skipped ({study})", flush=True)
      continue
    if mesh_shape is not None:
      if mesh_shape[0] * mesh_shape[1] != devices:
        raise SystemExit(f"--mesh {mesh_shape} does not multiply to the {devices} devices.")
      mesh = jax.make_mesh(mesh_shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    else:
      mesh = scale.mesh_for(devices, int(config.scale.batch_size), int(config.mesh.get("model", 1)))
    t0 = time.time()
    try:
      program = study.scale_program(config, mesh)
      row = scale.analyse(program, mesh)
    except Exception as e:  # keep going; the failure is a row of its own
      row = {"program": f"{slug} (failed: {type(e).__name__}: {str(e)[:200]})", "devices": devices,
             "mesh": scale.mesh_str(mesh)}
      program = None
    if run and program is not None:
      try:
        row.update(scale.measure(program, mesh, steps=steps))
      except Exception as e:  # e.g. out of memory on one accelerator: the estimate stays, the run says why not
        row["measured_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    row["paper"] = slug
    row["source"] = str(config.scale.get("source", ""))
    row["host_load"] = round(os.getloadavg()[0], 1)  # compile_s depends on how busy the machine was
    rows.append(row)
    print(f"--- {slug}:{variant} on {row['mesh']}: {row.get('compile_s', '?')} s compile, "
          f"peak {scale.gb(row.get('peak_bytes'))} GB/device ({time.time() - t0:.0f} s)", flush=True)
  return rows


def merge_rows(path: str, new: list[dict]) -> list[dict]:
  """Rows of `path` with those of `new` added; a saved row with the same program, devices and mesh is replaced."""
  old = []
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
  keys = {tuple(r.get(k) for k in KEY_FIELDS) for r in new}
  kept = [r for r in old if tuple(r.get(k) for k in KEY_FIELDS) not in keys]
  rows = kept + new
  return sorted(rows, key=lambda r: (str(r.get("program")), int(r.get("devices", 0)), str(r.get("mesh"))))


def _fmt(v, kind: str) -> str:
  from iclr24_jax.common.scale import gb
  if v is None:
    return "-"
  if kind == "gb":
    return gb(v)
  if kind == "tflop":
    return f"{v / 1e12:.3g}"
  if kind == "s":
    return f"{v:.3g}"
  if kind == "bool":
    return "yes" if v else "no"
  return str(v)


def _cpu_note(rows_by_paper: dict[str, list[dict]]) -> str:
  loads = [r["host_load"] for rows in rows_by_paper.values() for r in rows if r.get("host_load") is not None]
  cpus = os.cpu_count()
  if not loads:
    return f"{cpus} CPU cores"
  return f"{cpus} CPU cores at a 1-minute load average of {min(loads):g}-{max(loads):g}"


def write_markdown(rows_by_paper: dict[str, list[dict]], skipped: dict[str, str], path: str) -> str:
  """results/SCALE.md: one table over every paper's rows, then each paper's program, sources and notes."""
  import jax
  lines = [
      "# Paper scale", "",
      f"Generated by `iclr24 scale` (`python -m experiments.scale`) on {datetime.date.today().isoformat()} with jax {jax.__version__}: "
      "each paper's `paper` config (`configs/<slug>.py:paper`, the official run's sizes, cited in the config) "
      "built by its `study.scale_program(config, mesh)`, lowered and compiled on abstract inputs sharded over "
      "simulated CPU devices (nothing allocated). All figures are per device and per step. The mesh is "
      "('data', 'model'): parameters FSDP-sharded over 'data' and tensor-parallel over 'model', the batch over "
      "'data'. See `iclr24_jax/common/scale.py` for what each number is.", "",
      "How to read it:",
      "* Memory is XLA:CPU's buffer assignment (`memory_analysis()`): argument / output / temp bytes, and "
      "peak = argument + output - donated + temp. GPU and TPU compilers fuse and schedule differently, and "
      "XLA:CPU widens bfloat16 matmuls to float32, so bfloat16 programs' temporaries here are an over-estimate. "
      "'fits' compares the peak with 80 GB (H100) and 16 GB (TPU v5e).",
      "* FLOPs: XLA's `cost_analysis()` plus the matmul FLOPs of the `lax.scan` iterations it does not count "
      "(it costs a loop body once); with rematerialised layers they include the recomputed forward. 'hand' is "
      "the model's own count (2 x weights x tokens forward, 3x for training, plus attention), without "
      "recomputation.",
      "* Step time is a roofline lower bound per device: max(FLOPs / peak, bytes / bandwidth) with 989 TFLOP/s "
      "and 3.35 TB/s (H100 SXM, bf16 dense) or 197 TFLOP/s and 819 GB/s (TPU v5e); communication is ignored.",
      "* 'measured' is `--run` on a real accelerator (random inputs, 10 steps after one warm-up), on the devices "
      "that row names; a row no accelerator has run says 'not run'.",
      f"* compile s is wall time on the machine that made the table ({_cpu_note(rows_by_paper)}).", "",
      "| paper | program | params | devices | mesh | param GB | arg GB | temp GB | out GB | peak GB | "
      "TFLOP (XLA) | TFLOP (hand) | bytes GB | compile s | H100 s/step | v5e s/step | fits 80 GB | fits 16 GB | "
      "measured steps/s | paper's hardware / time |",
      "|" + "---|" * 20]
  for slug, rows in rows_by_paper.items():
    for r in rows:
      measured = r.get("measured_steps_per_s")
      if measured is not None:
        measured = f"{measured:.3g} ({r.get('measured_backend')})"
      else:
        measured = "failed: " + r["measured_error"][:60] if r.get("measured_error") else "not run"
      params = r.get("params")
      lines.append("| " + " | ".join([
          slug, str(r.get("program", "?")), f"{params / 1e9:.2f}B" if params else "-", str(r.get("devices", "-")),
          str(r.get("mesh", "-")), _fmt(r.get("param_bytes"), "gb"), _fmt(r.get("argument_bytes"), "gb"),
          _fmt(r.get("temp_bytes"), "gb"), _fmt(r.get("output_bytes"), "gb"), _fmt(r.get("peak_bytes"), "gb"),
          _fmt(r.get("flops"), "tflop"), _fmt(r.get("hand_flops"), "tflop"), _fmt(r.get("bytes_accessed"), "gb"),
          _fmt(r.get("compile_s"), "s"), _fmt(r.get("step_s_h100"), "s"), _fmt(r.get("step_s_v5e"), "s"),
          _fmt(r.get("fits_h100_80gb"), "bool"), _fmt(r.get("fits_v5e_16gb"), "bool"), measured,
          f"{r.get('paper_hardware') or '-'}; time: {r.get('paper_time') or '-'}"]) + " |")
  lines += ["", "## Programs, sources and notes", ""]
  for slug, rows in rows_by_paper.items():
    if not rows:
      continue
    r = rows[-1]
    lines.append(f"* **{slug}** ({r.get('program')}): {r.get('items_per_step', '?')} {r.get('item', 'items')} "
                 f"per step. Sizes from {r.get('source') or 'the config'}. {r.get('notes', '')}".rstrip())
    replicated = max((x.get("replicated_param_bytes") or 0) for x in rows)
    if replicated:
      lines.append(f"  Replicated parameter bytes per device (leaves >= 16 MiB no mesh axis divides): "
                   f"{replicated / 1e9:.2f} GB at most.")
  if skipped:
    lines += ["", "## Not tabled yet", ""]
    lines += [f"* {slug}: {why}" for slug, why in skipped.items()]
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def rebuild_table(out: str) -> str:
  """Rebuilds `out`/SCALE.md from the rows in `out`/scale/*.json; returns its path.

  The measured columns are the rows' own; the paper's hardware and time are read again from each paper's
  `paper` config (`config.scale.paper_hardware` / `paper_time`), so a corrected citation reaches the table
  without recompiling anything.

  Args:
    out: the results folder (holds scale/<slug>.json).

  Returns:
    The path of SCALE.md.
  """
  from iclr24_jax import registry
  rows_by_paper, skipped = {}, {}
  for slug in registry.PAPERS:
    path = os.path.join(out, "scale", f"{slug}.json")
    config, why = paper_entry(slug)
    if os.path.exists(path):
      with open(path) as f:
        rows_by_paper[slug] = json.load(f)
      if config is not None:
        for r in rows_by_paper[slug]:
          r["paper_hardware"] = str(config.scale.get("paper_hardware", r.get("paper_hardware", "")))
          r["paper_time"] = str(config.scale.get("paper_time", r.get("paper_time", "")))
    else:
      skipped[slug] = why if config is None else f"not compiled yet (iclr24 scale --only {slug})"
  os.makedirs(out, exist_ok=True)
  return write_markdown(rows_by_paper, skipped, os.path.join(out, "SCALE.md"))


def main(argv: list[str] | None = None) -> int:
  """The command line (`iclr24 scale ...`); returns the exit code."""
  parser = argparse.ArgumentParser(prog="iclr24 scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", default="", help="comma-separated paper slugs (default: all with a paper config)")
  parser.add_argument("--devices", type=int, default=0,
                      help="simulated CPU devices in this process (default: 8 and 64, one subprocess each)")
  parser.add_argument("--mesh", default="", help="data,model sizes, e.g. 2,4 (default: from the config's batch)")
  parser.add_argument("--run", action="store_true", help="also run each step on the available accelerator")
  parser.add_argument("--steps", type=int, default=10, help="timed steps with --run")
  parser.add_argument("--out", default=os.path.join(ROOT, "results"))
  parser.add_argument("--rows-out", default="", help=argparse.SUPPRESS)  # a child writes its rows here
  parser.add_argument("--table", action="store_true", help="run nothing; rebuild SCALE.md from results/scale")
  args = parser.parse_args(argv)
  if args.table:
    print(f"wrote {rebuild_table(args.out)}")
    return 0
  mesh_shape = tuple(int(x) for x in args.mesh.split(",")) if args.mesh else None
  if mesh_shape is not None and len(mesh_shape) != 2:
    raise SystemExit("--mesh takes two sizes: data,model (e.g. 2,4).")

  if args.run:
    import jax
    if jax.default_backend() == "cpu":
      raise SystemExit("--run times the steps on an accelerator (GPU / TPU); this process only sees CPUs. The "
                       "paper-size inputs would be allocated in host memory (a 70B model needs 140 GB).")
  if args.devices or args.run:
    if args.devices and not args.run:
      from iclr24_jax.common.sharding import simulate_cpu_devices
      simulate_cpu_devices(args.devices)
    new = analyse_papers(_slugs(args.only), mesh_shape, args.run, args.steps)
    if args.rows_out:
      with open(args.rows_out, "w") as f:
        json.dump(new, f)
      return 0
  else:
    new = []
    for n in DEFAULT_DEVICES:
      with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        rows_path = tmp.name
      cmd = [sys.executable, "-m", "iclr24_jax.launch.scale", "--devices", str(n), "--only", args.only,
             "--rows-out", rows_path] + (["--mesh", args.mesh] if args.mesh else [])
      print(f"=== {n} devices: {' '.join(cmd[1:])}", flush=True)
      subprocess.run(cmd, check=True, cwd=_HERE if os.path.exists(os.path.join(_HERE, "setup.py")) else None)
      with open(rows_path) as f:
        new += json.load(f)
      os.unlink(rows_path)
  os.makedirs(os.path.join(args.out, "scale"), exist_ok=True)
  failed = [r for r in new if "failed" in str(r.get("program"))]
  for slug in dict.fromkeys(r["paper"] for r in new):
    path = os.path.join(args.out, "scale", f"{slug}.json")
    rows = merge_rows(path, [r for r in new if r["paper"] == slug and r not in failed])
    with open(path, "w") as f:
      json.dump(rows, f, indent=1)
  print(f"wrote {rebuild_table(args.out)}")
  for r in failed:
    print(f"FAILED: {r['program']}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
