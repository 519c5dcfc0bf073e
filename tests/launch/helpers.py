"""Shared by the launcher's resume tests and the papers' staged-driver resume tests: results and metrics rows
without their wall-clock figures, so a killed-and-resumed run compares equal to an uninterrupted one."""
import os

from iclr24_jax.common import metrics as metrics_lib

# Keys (by suffix) whose values are wall-clock figures: they differ between any two runs.
TIMING = ("steps_per_s", "seconds", "_s", "wall_seconds", "train_seconds")


def _comparable(tree, workdir: str | None = None):
  """The results without wall-clock figures (speeds, seconds) and the resume step, which differ between runs, and
  with the workdir's path (in plot paths) written as '<workdir>' (arrays as lists, as results.json has them)."""
  tree = metrics_lib.to_python(tree)
  if isinstance(tree, dict):
    return {k: _comparable(v, workdir) for k, v in tree.items()
            if not (k.endswith(TIMING) or k.startswith("resumed_from") or k in ("seconds_distributions",))}
  if isinstance(tree, list):
    return [_comparable(v, workdir) for v in tree]
  if workdir and isinstance(tree, str):
    return tree.replace(workdir, "<workdir>")
  return tree


def _rows(workdir: str) -> dict:
  """Every metrics.jsonl under workdir (relative path -> rows without their speed column)."""
  out = {}
  for root, _, files in os.walk(workdir):
    if "metrics.jsonl" in files:
      rows = metrics_lib.read_jsonl(os.path.join(root, "metrics.jsonl"))
      out[os.path.relpath(root, workdir)] = [_comparable(r) for r in rows]
  return out


class _Crash(Exception):
  """Stands for a process killed without warning (nothing is saved at the kill)."""
