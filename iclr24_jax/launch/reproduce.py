"""Runs every registered experiment's small reproduction and writes results/REPRODUCTION.md.

  iclr24 reproduce                 # everything that exists, embedded defaults
  iclr24 reproduce --only pmp,cdgm # a subset
  iclr24 reproduce --fast          # tiny settings (smoke test of the whole pipeline)
  iclr24 reproduce --only nci --keep   # rerun one; keep the other experiments' saved rows
  iclr24 reproduce --table         # only rebuild REPRODUCTION.md from results/rows/*.json
  iclr24 reproduce --only mario_seeds --keep   # a study outside the main job (registry.EXTENDED)

Each experiment runs in its own subprocess (a crash or leak in one cannot take down the others), `--jobs` of them
at once (default min(2, CPU count): JAX keeps two cores busy only part of the time, so two at once use both),
longest first by their last recorded CPU seconds;
The studies in `registry.EXTENDED` (too heavy for the main job) run only when named; the main job tables their
recorded rows. An experiment's rows land in <workdir>/<name>/rows.json and, for a full (non --fast) run, in
results/rows/<name>.json
(committed, with the run's wall and CPU seconds and the load average; its plots are copied to results/plots/). The table collects them with the
paper's value or claim and whether it holds here: 'yes' / 'no' beyond 2 standard errors over seeds, 'inconclusive'
inside them (`iclr24_jax.common.stats`). Every row has a kind: a claim (a statement the paper makes; its basis
quotes the paper), a check (the implementation, or a setting whose outcome its construction fixes: pass / fail) or
a measurement (no verdict); the summary counts them apart, and a row without a valid kind stops the table
(`stats.row_kind`). Each paper's study module lists the headline claims of its abstract that no row tests yet in
`NOT_RUN` (`stats.not_run_row`); they are tabled as 'not run' claims, so the gap shows.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time

# The folder holding the `iclr24_jax` package: a checkout's root, or site-packages for an installed copy.
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A checkout (setup.py beside iclr24_jax/) writes into itself; an installed copy writes under the current directory.
ROOT = _HERE if os.path.exists(os.path.join(_HERE, "setup.py")) else os.getcwd()


def _site_dir() -> str:
  """The folder that holds the `iclr24_jax` package when installed (site-packages or a --target dir)."""
  return _HERE if not os.path.exists(os.path.join(_HERE, "setup.py")) else ""


def _run_one(name: str, workdir: str, fast: bool, json_out: str) -> None:
  sys.path.insert(0, _HERE)
  from iclr24_jax.common.compile_cache import enable_compilation_cache
  enable_compilation_cache()  # programs compiled by an earlier run load from disk (ICLR24_JAX_COMPILATION_CACHE=0: off)
  from iclr24_jax import registry
  fn = registry.reproduce_fn(name)
  rows = [] if fn is None else fn(os.path.join(workdir, name), fast=fast, **registry.study_kwargs(fn, name))
  from iclr24_jax.common.metrics import to_python
  with open(json_out, "w") as f:
    json.dump(to_python(rows), f, indent=1, default=str)


def _fmt(v):
  if v is None:
    return "-"
  if isinstance(v, dict):
    return "-"
  if isinstance(v, bool):
    return "yes" if v else "no"
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v).replace("|", "/").replace("\n", " ")


# The summary's columns: (kind, verdict as tabled). A check's 'yes' is a pass and its 'no' a fail.
COLUMNS = (("claim", "yes"), ("claim", "no"), ("claim", "inconclusive"), ("claim", "not run"),
           ("check", "pass"), ("check", "fail"), ("check", "inconclusive"), ("measurement", "-"))
_CHECK_VERDICT = {"yes": "pass", "no": "fail", "inconclusive": "inconclusive"}


def row_verdict(row: dict, where: str = "", smoke: bool = False) -> tuple[str, str]:
  """(kind, verdict as tabled) of a row: a claim's yes / no / inconclusive / not run, a check's pass / fail /
  inconclusive, '-' for a measurement (and, in a smoke run's table, for a claim or check its study left unjudged).

  Args:
    row: a reproduction row (kind, holds, basis, ...).
    where: how an error names the row ("experiment 'cpm', row 3 (...)").
    smoke: a --fast run's table, whose studies may leave claims and checks unjudged.

  Returns:
    (kind, verdict), e.g. ('check', 'pass') or ('claim', 'not run').

  Raises:
    stats.RowKindError: the row's kind is missing, unknown or does not fit its verdict (`where` names the row).
  """
  from iclr24_jax.common import stats
  kind = stats.row_kind(row, where, require_verdict=not smoke)
  holds = stats.normalise_holds(row.get("holds"))
  if kind == "measurement" or holds is None:
    return kind, "-"
  return kind, _CHECK_VERDICT[holds] if kind == "check" else holds


def _where(name: str, index: int, row: dict) -> str:
  return f"experiment {name!r}, row {index} ({row.get('experiment')!r} / {row.get('metric')!r})"


def summary_counts(all_rows: dict, smoke: bool = False) -> dict[str, dict[tuple[str, str], int]]:
  """Per experiment, the number of rows in each `COLUMNS` cell (a smoke run also counts its unjudged claims and
  checks, under ('claim', '-') and ('check', '-')).

  Args:
    all_rows: {experiment name: [row, ...]}.
    smoke: a --fast run's table (see `row_verdict`).

  Returns:
    {experiment name: {(kind, verdict): count}} over `COLUMNS` and the two smoke cells.

  Raises:
    stats.RowKindError: a row without a valid kind, named by experiment and row index.
  """
  counts = {}
  for name, rows in all_rows.items():
    c = dict.fromkeys(COLUMNS + (("claim", "-"), ("check", "-")), 0)
    for i, r in enumerate(rows):
      c[row_verdict(r, _where(name, i, r), smoke)] += 1
    counts[name] = c
  return counts


def summary_lines(all_rows: dict, smoke: bool = False) -> list[str]:
  """Per experiment: claims (yes / no / inconclusive / not run) apart from checks (pass / fail / inconclusive) and
  measurements, and the totals; a smoke run adds a column of the claims and checks it left unjudged.

  Args:
    all_rows: {experiment name: [row, ...]}.
    smoke: a --fast run's table (see `row_verdict`).

  Returns:
    The Markdown table's lines: header, rule, one line per experiment, the totals.

  Raises:
    stats.RowKindError: a row without a valid kind, named by experiment and row index.
  """
  counts = summary_counts(all_rows, smoke)
  cols = COLUMNS + ((("claim", "-"), ("check", "-")) if smoke else ())
  head = ("| experiment | claims: yes | no | inconclusive | not run | checks: pass | fail | inconclusive | "
          "measurements |" + (" unjudged (smoke run) |" if smoke else ""))
  lines = [head, "|---" * (len(COLUMNS) + 1 + int(smoke)) + "|"]
  total = dict.fromkeys(cols, 0)
  for name, c in counts.items():
    for k in cols:
      total[k] += c[k]
    cells = [str(c[k]) for k in COLUMNS] + ([str(c[("claim", "-")] + c[("check", "-")])] if smoke else [])
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  cells = [f"**{total[k]}**" for k in COLUMNS]
  cells += [f"**{total[('claim', '-')] + total[('check', '-')]}**"] if smoke else []
  lines.append("| **all** | " + " | ".join(cells) + " |")
  return lines


def not_run_rows(name: str) -> list[dict]:
  """The `NOT_RUN` rows of a paper's study module (headline claims no row tests yet).

  Args:
    name: an experiment name (a paper slug, a family check or an extended study).

  Returns:
    Copies of the paper's `NOT_RUN` rows; [] for a family check, an extended study or a study without the list.
  """
  from iclr24_jax import registry
  if name not in registry.PAPERS or not registry.exists(name):
    return []
  return [dict(r) for r in getattr(registry.study_module(name), "NOT_RUN", [])]


def with_not_run(all_rows: dict) -> dict:
  """`all_rows` with each paper's `NOT_RUN` rows appended (a row a run already recorded is not repeated).

  Args:
    all_rows: {experiment name: [row, ...]}, e.g. `load_saved_rows`'s rows.

  Returns:
    A new dict of new lists; the input is not changed.
  """
  out = {}
  for name, rows in all_rows.items():
    seen = {(r.get("experiment"), r.get("metric"), r.get("basis")) for r in rows}
    extra = [r for r in not_run_rows(name) if (r.get("experiment"), r.get("metric"), r.get("basis")) not in seen]
    out[name] = list(rows) + extra
  return out


def save_rows(name: str, rows: list, seconds: float, results_dir: str, workdir: str,
              cpu_seconds: float | None = None, load: float | None = None) -> list:
  """Copies the rows' plots into results/plots and writes results/rows/<name>.json; returns the saved rows.

  `cpu_seconds` (user + system of the experiment's process) and `load` (the 1-minute load average at its end) say
  how far the wall `seconds` were inflated by a shared machine.
  """
  plot_dir = os.path.join(results_dir, "plots")
  saved = []
  for r in rows:
    r = dict(r)
    rel = []
    for p in r.get("plots", []) or []:
      if p and os.path.exists(p) and not os.path.abspath(p).startswith(os.path.abspath(plot_dir)):
        dst = os.path.join(plot_dir, f"{name}_{os.path.basename(p)}")
        os.makedirs(plot_dir, exist_ok=True)
        shutil.copyfile(p, dst)
        rel.append(os.path.relpath(dst, results_dir))
      elif p and os.path.exists(os.path.join(results_dir, p)):
        rel.append(p)
    r["plots"] = rel
    saved.append(r)
  os.makedirs(os.path.join(results_dir, "rows"), exist_ok=True)
  with open(os.path.join(results_dir, "rows", f"{name}.json"), "w") as f:
    record = {"experiment": name, "date": datetime.date.today().isoformat(), "seconds": round(seconds, 1)}
    if cpu_seconds is not None:
      record["cpu_seconds"] = round(cpu_seconds, 1)
    if load is not None:
      record["load"] = round(load, 1)
    json.dump(dict(record, rows=saved), f, indent=1, default=str)
  return saved


def load_saved_rows(results_dir: str, names: list[str]) -> tuple[dict, dict]:
  """Rows and timings of results/rows/<name>.json for the given names (those that exist), in that order.

  Returns:
    ({name: rows}, {name: dict(seconds=, cpu_seconds=, load=)}) (a timing's missing fields are None).
  """
  rows, times = {}, {}
  for name in names:
    path = os.path.join(results_dir, "rows", f"{name}.json")
    if os.path.exists(path):
      with open(path) as f:
        saved = json.load(f)
      if isinstance(saved, list):  # a bare list of rows (written by hand or an older version)
        saved = {"rows": saved}
      rows[name] = saved["rows"]
      if saved.get("seconds") is not None:
        times[name] = {k: saved.get(k) for k in ("seconds", "cpu_seconds", "load")}
  return rows, times


def write_markdown(all_rows: dict, timings: dict, errors: dict, out_dir: str, fast: bool) -> str:
  """Writes <out_dir>/REPRODUCTION.md: the summary, the rows, the run times and the plots.

  Raises:
    stats.RowKindError: a row without a valid kind (nothing is written then).
  """
  summary = summary_lines(all_rows, smoke=fast)   # validates every row's kind before anything is written
  lines = ["# Small-scale reproductions", "",
           f"Generated by `iclr24 reproduce{' --fast' if fast else ''}` (table rebuilt "
           f"{datetime.date.today().isoformat()}; each experiment's rows are from its own run, saved in "
           "results/rows/, CPU unless stated). Each row has a kind. A **claim** tests a statement the paper makes "
           "(its notes open with the paper's words and where they stand); `holds` says whether it holds in our "
           "small setting (its direction, not its absolute number): 'yes' / 'no' only when the difference is beyond "
           "2 standard errors over seeds (or a bootstrap 95% interval over items excludes 0), 'inconclusive' when it "
           "is inside them, 'not run' for a headline claim of the abstract that no row tests yet (the notes say why "
           "and what would run it). A **check** verifies the implementation, or a setting whose outcome its "
           "construction fixes (pass / fail / inconclusive): it is not evidence for the paper. A **measurement** "
           "is a number without a verdict ('-').", "",
           "## Summary", ""] + summary + ["",
           "## Rows", "",
           "| paper | experiment | kind | metric | ours | paper's value / claim | holds | notes |",
           "|---|---|---|---|---|---|---|---|"]
  plots = []
  for name, rows in all_rows.items():
    for i, r in enumerate(rows):
      kind, verdict = row_verdict(r, _where(name, i, r), smoke=fast)
      notes = "; ".join(str(x) for x in (r.get("basis"), r.get("notes")) if x)
      cells = [_fmt(r.get(k)) for k in ("paper", "experiment")] + [kind]
      cells += [_fmt(r.get(k)) for k in ("metric", "ours", "paper_value")] + [verdict, _fmt(notes or None)]
      lines.append("| " + " | ".join(cells) + " |")
      for p in r.get("plots", []) or []:
        if not p:
          continue
        if os.path.isabs(p) and os.path.exists(p):  # a fast run's plot in the workdir
          dst = os.path.join(out_dir, "plots", f"{name}_{os.path.basename(p)}")
          os.makedirs(os.path.dirname(dst), exist_ok=True)
          shutil.copyfile(p, dst)
          plots.append((name, os.path.relpath(dst, out_dir)))
        elif os.path.exists(os.path.join(out_dir, p)):
          plots.append((name, p))
  for name, err in errors.items():
    lines.append(f"| {name} | (failed) | - | - | - | - | - | {_fmt(err[-300:])} |")
  lines += ["", "## Run times", "",
            "Wall seconds of each experiment's own run, its CPU seconds (user + system) where recorded, and the "
            "1-minute load average at its end: wall times measured on a shared, loaded machine are inflated; on an "
            "idle 2-core machine an experiment's wall time lies between its CPU seconds / 2 and its CPU seconds (JAX keeps "
            "both cores busy only part of the time).", "",
            "| experiment | wall s | CPU s | load |", "|---|---|---|---|"]

  def cell(v, fmt):
    return "-" if v is None else format(v, fmt)

  from iclr24_jax.registry import EXTENDED
  for k, v in timings.items():
    v = v if isinstance(v, dict) else {"seconds": v}
    label = f"{k} (outside the main job)" if k in EXTENDED else k
    lines.append(f"| {label} | {cell(v.get('seconds'), '.0f')} | {cell(v.get('cpu_seconds'), '.0f')} | "
                 f"{cell(v.get('load'), '.1f')} |")
  main = {k: v for k, v in timings.items() if k not in EXTENDED}
  if main:
    walls = [v["seconds"] if isinstance(v, dict) else v for v in main.values()]
    cpus = [v.get("cpu_seconds") if isinstance(v, dict) else None for v in main.values()]
    known = [c for c in cpus if c is not None]
    lines.append(f"| **all (the main job)** | **{sum(w for w in walls if w is not None):.0f}** | "
                 f"**{sum(known):.0f}** ({len(known)} of {len(cpus)} recorded) | |")
  if plots:
    lines += ["", "## Plots", ""]
    for name, rel in dict.fromkeys(plots):
      lines.append(f"- {name}: ![{os.path.basename(rel)}]({rel})")
  path = os.path.join(out_dir, "REPRODUCTION.md")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def main(argv: list[str] | None = None) -> int:
  """The command line (`iclr24 reproduce ...`); returns the exit code."""
  parser = argparse.ArgumentParser(prog="iclr24 reproduce", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", default="", help="comma-separated experiment names")
  parser.add_argument("--skip", default="", help="comma-separated experiment names to skip")
  parser.add_argument("--fast", action="store_true", help="tiny settings")
  parser.add_argument("--keep", action="store_true",
                      help="also table the saved rows (results/rows/<name>.json) of experiments not run now")
  parser.add_argument("--table", action="store_true", help="run nothing; rebuild REPRODUCTION.md from results/rows")
  parser.add_argument("--jobs", type=int, default=0,
                      help="experiments run at once, each in its own process (0: min(2, CPU count))")
  parser.add_argument("--workdir", default=os.path.join(ROOT, "runs", "reproduce"))
  parser.add_argument("--out", default=os.path.join(ROOT, "results"))
  parser.add_argument("--_one", default="", help=argparse.SUPPRESS)
  parser.add_argument("--_json", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args._one:
    _run_one(args._one, args.workdir, args.fast, args._json)
    return 0
  sys.path.insert(0, _HERE)
  from iclr24_jax import registry
  only = [n for n in args.only.split(",") if n]
  every = registry.available() + registry.extended()
  unknown = [n for n in only if n not in every]
  if unknown:
    parser.error(f"unknown experiment(s) {unknown}; choose from {every}")
  # The main job: every experiment but the extended studies, which run only when named in --only.
  names = [n for n in every if (n in only if only else n not in registry.EXTENDED) and n not in args.skip.split(",")]
  os.makedirs(args.out, exist_ok=True)
  all_rows, timings, errors = {}, {}, {}
  if args.table:
    all_rows, timings = load_saved_rows(args.out, every)
    print(f"wrote {write_markdown(with_not_run(all_rows), timings, {}, args.out, False)}")
    return 0
  _, saved_times = load_saved_rows(args.out, names)
  jobs = args.jobs or min(2, os.cpu_count() or 1)
  # Longest first (by the last recorded CPU seconds): with `jobs` at once this shortens the whole run.
  order = sorted(names, key=lambda n: -float((saved_times.get(n) or {}).get("cpu_seconds") or 0.0))
  running: dict[int, tuple] = {}

  def start(name):
    os.makedirs(os.path.join(args.workdir, name), exist_ok=True)
    json_out = os.path.join(args.workdir, name, "rows.json")
    log = open(os.path.join(args.workdir, name, "stderr.log"), "w+")
    cmd = [sys.executable, "-m", "iclr24_jax.launch.reproduce", "--_one", name, "--_json", json_out,
           "--workdir", args.workdir] + (["--fast"] if args.fast else [])
    print(f"=== {name} (started) ===", flush=True)
    proc = subprocess.Popen(cmd, cwd=_HERE if _HERE != _site_dir() else None, stderr=log, text=True)
    running[proc.pid] = (name, proc, log, json_out, time.time())

  def finish(pid, status, usage):
    name, proc, log, json_out, t0 = running.pop(pid)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime   # this child's own CPU seconds (wait4), even with others running
    timings[name] = {"seconds": time.time() - t0, "cpu_seconds": cpu, "load": os.getloadavg()[0]}
    secs = timings[name]["seconds"]
    log.seek(0)
    err = log.read()
    log.close()
    if proc.returncode != 0:
      errors[name] = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
      sys.stderr.write(err[-3000:])
      print(f"--- {name} FAILED ({secs:.0f}s)", flush=True)
      return
    with open(json_out) as f:
      all_rows[name] = json.load(f)
    if not args.fast:  # a full run's rows are the committed record
      all_rows[name] = save_rows(name, all_rows[name], secs, args.out, args.workdir, cpu_seconds=cpu,
                                 load=timings[name]["load"])
    print(f"--- {name}: {len(all_rows[name])} rows ({secs:.0f}s wall, {cpu:.0f}s CPU)", flush=True)

  pending = list(order)
  while pending or running:
    while pending and len(running) < jobs:
      start(pending.pop(0))
    pid, status, usage = os.wait4(-1, 0)
    if pid in running:
      finish(pid, status, usage)
  all_rows = {n: all_rows[n] for n in names if n in all_rows}    # registry order in the table
  timings = {n: timings[n] for n in names if n in timings}
  if not args.fast and not args.keep and not only:
    # The extended studies are not part of the main job: their recorded rows are tabled beside its own.
    saved_rows, saved_times = load_saved_rows(args.out, [n for n in registry.extended() if n not in all_rows])
    all_rows.update(saved_rows)
    timings.update({n: t for n, t in saved_times.items() if n in saved_rows})
  if args.keep:  # saved rows of the experiments not run this time, in registry order
    saved_rows, saved_times = load_saved_rows(args.out, every)
    merged_rows, merged_times = {}, {}
    for name in every:
      if name in all_rows:
        merged_rows[name], merged_times[name] = all_rows[name], timings[name]
      elif name in saved_rows and name not in errors:
        merged_rows[name] = saved_rows[name]
        if name in saved_times:
          merged_times[name] = saved_times[name]
    all_rows, timings = merged_rows, merged_times
  path = write_markdown(with_not_run(all_rows), timings, errors, args.out, args.fast)
  print(f"wrote {path}")
  return 1 if errors else 0


if __name__ == "__main__":
  sys.exit(main())
