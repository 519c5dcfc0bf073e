"""Which experiments exist: the family checks (classify, diffusion, ppo, lm) and the 19 papers.

An experiment module (`iclr24_jax/papers/<slug>/experiment.py`, or a family's `experiment.py`) offers
  run(config, workdir) -> dict                      # the launcher calls this
and the study module (`study.py` beside it; the experiment module itself where there is none) offers
  reproduce(workdir, fast=False[, *, get_config]) -> list[dict]   # rows for results/REPRODUCTION.md (optional)
  benchmark(quick=True[, *, get_config]) -> list[dict]            # rows for experiments/benchmark.py (optional)
so that the method files stay the method and the small-scale studies live in one place per paper. Configs are
data the library never imports: a study function that reads configs declares a keyword-only `get_config`, and
the runners pass it the experiment's packaged `get_config` (`config_factory`, `study_kwargs`).
A reproduction row has: paper, experiment, metric, ours, paper_value, holds (True/False/None), and
optionally notes and plots (paths). Papers register themselves by existing; nothing else to edit.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
from types import ModuleType
from typing import Any, Callable

FAMILY = {
    "classify": "iclr24_jax.vision.experiment",
    "diffusion": "iclr24_jax.diffusion.experiment",
    "ppo": "iclr24_jax.rl.experiment",
    "lm": "iclr24_jax.lm.experiment",
}

PAPERS = ("llmbar", "fps", "clip_ood", "finetune_dissect", "motif", "coboosting", "cpm", "d2pruning", "unio4",
          "graphcare", "nci", "mdm", "ldcq", "pmp", "cdgm", "lm_inversion", "mario", "safeguards", "daclip")


# Studies too heavy for the main job (about 80 minutes on 2 cores): run by name, e.g.
# `python -m experiments.reproduce --only mario_seeds`; their recorded rows (results/rows/<name>.json) are tabled
# with the rest. name -> (paper, function of the paper's study module with the `reproduce` signature).
EXTENDED = {"mario_seeds": ("mario", "reproduce_seeds"), "nci_pretrained": ("nci", "reproduce_pretrained"),
            "lm_inversion_seeds": ("lm_inversion", "reproduce_seeds"), "daclip_seeds": ("daclip", "reproduce_seeds"),
            "mdm_seeds": ("mdm", "reproduce_seeds")}


def module_name(name: str) -> str:
  """The experiment module's dotted name of `name` (a family check or a paper slug)."""
  if name in FAMILY:
    return FAMILY[name]
  if name in PAPERS:
    return f"iclr24_jax.papers.{name}.experiment"
  raise ValueError(f"unknown experiment '{name}'; known: {sorted(FAMILY) + sorted(PAPERS)}.")


def exists(name: str) -> bool:
  try:
    return importlib.util.find_spec(module_name(name)) is not None
  except ModuleNotFoundError:
    return False


def experiment_module(name: str) -> ModuleType:
  """Imports the experiment module of `name` (a family check or a paper slug)."""
  if not exists(name):
    raise ValueError(f"experiment '{name}' is not implemented yet (no module {module_name(name)}).")
  return importlib.import_module(module_name(name))


def study_module(name: str) -> ModuleType:
  """The module with `reproduce` / `benchmark` of `name`: its `study.py` when it has one, else its experiment."""
  experiment = experiment_module(name)
  study_name = module_name(name).rsplit(".", 1)[0] + ".study"
  try:
    found = importlib.util.find_spec(study_name) is not None
  except ModuleNotFoundError:
    found = False
  return importlib.import_module(study_name) if found else experiment


def available() -> list[str]:
  """Names with an experiment module, families first."""
  return [n for n in list(FAMILY) + list(PAPERS) if exists(n)]


def extended() -> list[str]:
  """Names of the studies outside the main job (`EXTENDED`) whose paper and study function exist."""
  return [n for n, (paper, fn) in EXTENDED.items() if exists(paper) and hasattr(study_module(paper), fn)]


def reproduce_fn(name: str):
  """The `reproduce(workdir, fast=False) -> rows` of an experiment or an extended study, or None if it has none.

  Raises:
    ValueError: an unknown name.
  """
  if name in EXTENDED:
    paper, fn = EXTENDED[name]
    return getattr(study_module(paper), fn, None)
  return getattr(study_module(name), "reproduce", None)


def config_factory(name: str) -> Callable[[str | None], Any]:
  """The `get_config(variant)` of the packaged config of an experiment or an extended study (its paper's).

  Only the runners call this; library code receives configs and never imports them.

  Args:
    name: an experiment (`available()`) or an extended study (`EXTENDED`).

  Returns:
    `iclr24_jax.configs.<paper>.get_config`.

  Raises:
    ValueError: a name without a packaged config (`iclr24_jax/configs/<name>.py`).
  """
  paper = EXTENDED[name][0] if name in EXTENDED else name
  module = f"iclr24_jax.configs.{paper}"
  if importlib.util.find_spec(module) is None:
    raise ValueError(f"'{name}' has no packaged config ({module}); add iclr24_jax/configs/{paper}.py.")
  return importlib.import_module(module).get_config


def study_kwargs(fn: Callable, name: str) -> dict[str, Any]:
  """The keyword arguments the runners add to a study function of `name`: `get_config` where it declares one.

  Args:
    fn: a study function (`reproduce`, `benchmark`, an extended study).
    name: the experiment or extended study it belongs to.

  Returns:
    {'get_config': `config_factory(name)`} when `fn` has a `get_config` parameter, else {}.
  """
  return {"get_config": config_factory(name)} if "get_config" in inspect.signature(fn).parameters else {}
