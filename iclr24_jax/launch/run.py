"""`iclr24 run --config=<slug>[:variant] --workdir=<dir>`: one experiment in one workdir, safe to kill and rerun.

  iclr24 run --config=pmp:tiny --workdir=runs/pmp            # the packaged config, from any directory
  iclr24 run --config=configs/pmp.py:tiny --workdir=runs/pmp # a config file path (absl config_flags)
  iclr24 run --config=pmp:tiny --workdir=runs/pmp --config.num_steps=50 --allow_config_change

Runs `iclr24_jax.papers.<config.paper>.experiment.run(config, workdir)` (or a family experiment such as
`classify`) through `run` below, which owns what makes a workdir safe:
- the workdir is checked before any data loads (a file, not writable: `WorkdirError`, exit 73);
- one run per workdir: `run.lock` (pid, host, start time); a second launcher exits 75 naming the holder;
- the config is recorded on the first start (`config.json`); a rerun with a different config exits 78 listing
  the keys old -> new, unless `--allow_config_change` (recorded in `config_changes.jsonl` with the step);
- a finished workdir (`status.json` says so, results.json exists) is a result: it is printed, nothing trains;
  `--fresh` clears the workdir and starts over;
- SIGTERM / SIGINT: the training loop saves at its next step boundary and the launcher exits with one line and
  128 + the signal number (143 / 130); rerunning the same command resumes from that checkpoint.
Add `--distributed` on multi-host systems (TPU pods, GPU clusters) to join the run first.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
from typing import Any, Callable, Sequence

from iclr24_jax.common import checkpoint as ckpt_lib
from iclr24_jax.common import loop as loop_lib

EXIT_WORKDIR, EXIT_BUSY, EXIT_CONFIG = 73, 75, 78   # sysexits.h: CANTCREAT, TEMPFAIL, CONFIG
RUN_FILES = (ckpt_lib.CONFIG_FILE, ckpt_lib.STATUS_FILE, "checkpoints", "metrics.jsonl", "results.json")


@dataclasses.dataclass
class Outcome:
  """What `run` did.

  Attributes:
    results: the experiment's results (the stored results.json when `stored`).
    stored: the workdir was finished already: nothing ran.
    config_changes: {dotted key: (old, new)} accepted with allow_config_change ({} otherwise).
  """

  results: dict
  stored: bool = False
  config_changes: dict = dataclasses.field(default_factory=dict)


def _clear(workdir: str) -> None:
  """Empties a run's workdir (keeps the lock this process holds); refuses a folder that holds no run."""
  entries = [e for e in os.listdir(workdir) if e != ckpt_lib.LOCK_FILE]
  if entries and not any(e in RUN_FILES for e in entries):
    raise ckpt_lib.WorkdirError(
        f"--fresh would delete {len(entries)} entries of {workdir}, which holds no run ({', '.join(RUN_FILES)} are "
        "all absent); clear it yourself or choose another --workdir.")
  for e in entries:
    path = os.path.join(workdir, e)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


def _read_results(workdir: str) -> dict:
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


def run(config: Any, workdir: str, *, fresh: bool = False, allow_config_change: bool = False,
        progress_fn: Callable[[int, dict], None] | None = None, command: str = "") -> Outcome:
  """Runs `config`'s experiment in `workdir` with the workdir's safety rules (see the module docstring).

  Args:
    config: the experiment's ConfigDict (its `paper` names the experiment).
    workdir: the run's folder (created).
    fresh: clear the workdir first and start over.
    allow_config_change: accept a config that differs from the recorded one (the change is recorded).
    progress_fn: called as `progress_fn(step, row)` with every row a training loop logs (brax's habit).
    command: recorded in the lock as the holder's command line.

  Returns:
    Outcome(results, stored, config_changes).

  Raises:
    checkpoint.WorkdirError: the workdir is a file or not writable (before anything else happens).
    checkpoint.WorkdirBusy: another launcher holds the workdir.
    checkpoint.ConfigDrift: the config differs from the recorded one (lists the keys, old -> new).
    loop.Preempted: SIGTERM / SIGINT stopped the run (a checkpoint of the step it names is saved).
  """
  from iclr24_jax import registry
  workdir = ckpt_lib.check_workdir(workdir)
  module = registry.experiment_module(config.paper)   # an unknown experiment fails before anything is written
  with ckpt_lib.WorkdirLock(workdir, command=command or " ".join(sys.argv)):
    if fresh:
      _clear(workdir)
    changes = ckpt_lib.check_config(workdir, config, allow_change=allow_config_change)
    if ckpt_lib.is_finished(workdir):
      return Outcome(_read_results(workdir), stored=True, config_changes=changes)
    loop_lib.clear_stop()
    ckpt_lib.write_status(workdir, "running")
    try:
      with (loop_lib.stop_on_signals(immediate=True), loop_lib.observe(progress_fn),
            ckpt_lib.config_checked(workdir)):   # checked above: the staged drivers' `Stages` skip their own check
        results = module.run(config, workdir)
    except loop_lib.Preempted as e:
      ckpt_lib.write_status(workdir, "preempted", step=e.step, signal=e.signal_name)
      raise
    except BaseException as e:
      ckpt_lib.write_status(workdir, "failed", error=f"{type(e).__name__}: {str(e)[:500]}")
      raise
    ckpt_lib.write_status(workdir, "finished")
    return Outcome(dict(results or {}), stored=False, config_changes=changes)


def headline(results: dict, depth: int = 2) -> dict[str, Any]:
  """The results' numbers and short strings, nested dicts flattened to dotted keys up to `depth` levels.

  Args:
    results: the results dict.
    depth: 2 prints pmp's `test.auc`; deeper levels (per-baseline tables) and lists stay in results.json.

  Returns:
    {key: value} in the results' order.
  """
  out = {}
  for k, v in results.items():
    if isinstance(v, dict) and depth > 1:
      out.update({f"{k}.{kk}": vv for kk, vv in headline(v, depth - 1).items()})
    elif isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 80):
      out[k] = v
  return out


def resolve_config(value: str) -> str:
  """`<slug>[:variant]` -> the packaged config file's path `[:variant]`; file paths pass unchanged.

  Args:
    value: the --config value, e.g. 'pmp:tiny', 'classify' or 'configs/pmp.py:tiny'.

  Returns:
    a value absl's config_flags reads (a file path, optionally ':variant').

  Raises:
    ValueError: a bare name that is no packaged config; the message lists them.
  """
  path, sep, variant = value.partition(":")
  if path.endswith(".py") or "/" in path or os.sep in path:
    return value
  spec = importlib.util.find_spec("iclr24_jax.configs")
  folder = os.path.dirname(spec.origin)
  known = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and not f.startswith("_")
                 and f != "variants.py")
  if path not in known:
    raise ValueError(f"--config={value}: '{path}' is no packaged config; choose one of {known} (e.g. "
                     f"--config={known[0]}:tiny) or give a config file path (configs/<slug>.py[:variant]).")
  return os.path.join(folder, f"{path}.py") + sep + variant


def _resolve_argv(argv: Sequence[str]) -> list[str]:
  out, i = [], 0
  argv = list(argv)
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config="):
      a = "--config=" + resolve_config(a[len("--config="):])
    elif a == "--config" and i + 1 < len(argv):
      out += [a, resolve_config(argv[i + 1])]
      i += 2
      continue
    out.append(a)
    i += 1
  return out


_FLAGS_DEFINED = []


def _define_flags():
  """Defines the launcher's absl flags once, when the command line is parsed (importing this module defines none,
  so a user's own absl app can import the library)."""
  from absl import flags
  from ml_collections import config_flags
  if _FLAGS_DEFINED:
    return _FLAGS_DEFINED[0]
  f = dict(
      config=config_flags.DEFINE_config_file("config", None, "<slug>[:variant] (a packaged config, e.g. pmp:tiny) "
                                             "or a config file path (configs/<slug>.py[:variant]).", lock_config=True),
      workdir=flags.DEFINE_string("workdir", None, "Where metrics, checkpoints, results and plots go."),
      fresh=flags.DEFINE_bool("fresh", False, "Clear the workdir and start over (even a finished one)."),
      allow_config_change=flags.DEFINE_bool("allow_config_change", False, "Resume with a config that differs from "
                                            "the recorded one; the change is recorded with its step."),
      distributed=flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() first (multi-host)."),
      coordinator=flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host without a "
                                      "scheduler)."),
      num_processes=flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host without a "
                                         "scheduler)."),
      process_id=flags.DEFINE_integer("process_id", None, "This process's index (multi-host without a scheduler)."),
      cpu_devices=flags.DEFINE_integer("cpu_devices", None, "Simulated CPU devices per process (testing)."))
  flags.mark_flags_as_required(["config", "workdir"])
  _FLAGS_DEFINED.append(f)
  return f


def _say(msg: str) -> None:
  print(f"iclr24: {msg}", file=sys.stderr, flush=True)


def _main(argv: Sequence[str], progress_fn: Callable[[int, dict], None] | None = None) -> int:
  from absl import flags, logging
  f = _define_flags()
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO; --verbosity=0 brings it back
  from iclr24_jax.common.compile_cache import enable_compilation_cache
  enable_compilation_cache()  # ~/.cache/iclr24_jax/jax; ICLR24_JAX_COMPILATION_CACHE=0 turns it off
  if f["distributed"].value:
    from iclr24_jax.common.sharding import initialize_distributed
    initialize_distributed(f["coordinator"].value, f["num_processes"].value, f["process_id"].value,
                           f["cpu_devices"].value)
  elif f["cpu_devices"].value:
    from iclr24_jax.common.sharding import simulate_cpu_devices
    simulate_cpu_devices(f["cpu_devices"].value)
  workdir = f["workdir"].value
  try:
    config = f["config"].value
  except (IOError, ValueError) as e:   # config_flags reports a config file that failed to load here
    _say(f"--config: {e}")
    return 2
  try:
    print(f"running {config.paper} in {workdir}", flush=True)
    out = run(config, workdir, fresh=f["fresh"].value, allow_config_change=f["allow_config_change"].value,
              progress_fn=progress_fn)
  except ckpt_lib.WorkdirError as e:
    _say(str(e))
    return EXIT_WORKDIR
  except ckpt_lib.WorkdirBusy as e:
    _say(str(e))
    return EXIT_BUSY
  except ckpt_lib.ConfigDrift as e:
    _say(str(e))
    return EXIT_CONFIG
  except loop_lib.Preempted as e:
    _say(f"{e} Run the same command again to resume.")
    return e.exit_code
  except KeyboardInterrupt:
    _say("interrupted (second Ctrl-C): stopped without saving; a rerun resumes from the last checkpoint.")
    return 130
  if out.config_changes:
    _say(f"config change accepted and recorded in {os.path.join(workdir, ckpt_lib.CHANGES_FILE)}: "
         + ", ".join(out.config_changes))
  if out.stored:
    print(f"{workdir} holds a finished run: its stored results (nothing trained; --fresh starts over):", flush=True)
  print(json.dumps(headline(out.results), indent=1), flush=True)
  return 0


def main(argv: Sequence[str] | None = None, progress_fn: Callable[[int, dict], None] | None = None) -> int:
  """The command line: parses absl flags from `argv` (default sys.argv), runs, returns the exit code.

  Args:
    argv: program name first, then flags ('--config=pmp:tiny', '--workdir=...').
    progress_fn: passed to `run` (for callers that drive the command line from Python).

  Returns:
    0, or the exit code of the named failure (73 workdir, 75 busy, 78 config drift, 143 / 130 preempted).
  """
  from absl import flags
  argv = list(sys.argv if argv is None else argv)
  try:
    argv = _resolve_argv(argv)
  except ValueError as e:
    _say(str(e))
    return 2
  _define_flags()
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    _say(f"{e}\nTry --helpfull.")
    return 2
  if len(rest) > 1:
    _say(f"unexpected arguments {rest[1:]}; flags are written --name=value.")
    return 2
  return _main(rest, progress_fn)
