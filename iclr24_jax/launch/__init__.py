"""The `iclr24` command: `run` one experiment, `reproduce` the studies, `benchmark` the steps, `scale` (paper sizes).

  iclr24 run --config=pmp:tiny --workdir=runs/pmp      # iclr24_jax.launch.run (absl flags)
  iclr24 reproduce --only pmp,cdgm                     # iclr24_jax.launch.reproduce
  iclr24 benchmark --only classify                     # iclr24_jax.launch.benchmark
  iclr24 scale --only mdm                              # iclr24_jax.launch.scale (paper sizes, compiled AOT)

From a checkout `python -m experiments.main | reproduce | benchmark | scale` are the same commands; `python -m
iclr24_jax.launch <command> ...` works wherever the library is installed. The library API is `launch.run.run`.
"""
from __future__ import annotations

import importlib
import sys
from typing import Sequence

COMMANDS = {"run": "iclr24_jax.launch.run", "reproduce": "iclr24_jax.launch.reproduce",
            "benchmark": "iclr24_jax.launch.benchmark", "scale": "iclr24_jax.launch.scale"}
USAGE = ("usage: iclr24 {run,reproduce,benchmark,scale} [flags]\n"
         "  run        one experiment in one workdir: iclr24 run --config=<slug>[:variant] --workdir=<dir>\n"
         "  reproduce  the small reproductions -> results/REPRODUCTION.md (--only a,b; --fast)\n"
         "  benchmark  compiled-step timings -> results/BENCHMARK.md (--only a,b)\n"
         "  scale      paper-size configs compiled on abstract inputs -> results/SCALE.md (--only a,b)\n"
         "'iclr24 <command> --help' shows the command's flags.")


def main(argv: Sequence[str] | None = None) -> int:
  """The console script: dispatches `iclr24 <command> ...` to the command's module; returns its exit code.

  Args:
    argv: the program name, the command, its flags (default sys.argv).

  Returns:
    the command's exit code (2 for an unknown command).
  """
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(USAGE)
    return 0 if len(argv) >= 2 else 2
  command, rest = argv[1], argv[2:]
  if command not in COMMANDS:
    print(f"iclr24: unknown command '{command}'.\n{USAGE}", file=sys.stderr)
    return 2
  name = COMMANDS[command]
  prog = f"{argv[0]} {command}"
  if command == "run":
    from iclr24_jax.launch import run
    return run.main([prog] + rest)
  try:
    return int(importlib.import_module(name).main(rest) or 0)
  except SystemExit as e:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
