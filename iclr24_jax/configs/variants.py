"""The one parser of a config's `arg` (the text after the colon in `--config=configs/<slug>.py:<arg>`).

Two shapes of `arg` exist:

* one variant (`one`): `arg` names a single variant, e.g. 'tiny' or 'heloc_ctgan'; a comma is no separator.
* a comma-separated list (`parse`): e.g. 'tiny,nested' or 'alpha=0.3,hetero'; `exclusive` names groups of
  which at most one may be given (MDM's arms, CPM's sizes, PMP's data sets).

A choice written 'key=<...>' accepts any part 'key=...' (the config checks the value). Both raise a ValueError
that names the config file, the bad part(s) and the choices. This module imports nothing from the library.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence


def _accepts(choice: str, part: str) -> bool:
  if "=" in choice:                       # 'alpha=<a>': any 'alpha=...'
    return part.startswith(choice.split("=", 1)[0] + "=")
  return part == choice


def _known(part: str, choices: Sequence[str]) -> bool:
  return any(_accepts(c, part) for c in choices)


def one(arg: str | None, choices: Iterable[str], *, name: str) -> str:
  """The single variant `arg` names ('' for the default), checked against `choices`.

  Args:
    arg: the variant, e.g. 'tiny'; None and '' both mean the default ('').
    choices: the accepted variants ('' is always accepted); a choice 'key=<...>' accepts any 'key=...'.
    name: the config's slug, e.g. 'pmp' (the error names configs/<name>.py).

  Returns:
    `arg`, or '' for None.

  Raises:
    ValueError: `arg` is not one of `choices`; the message names the file, `arg` and the choices.
  """
  arg = arg or ""
  choices = tuple(choices)
  if arg and not _known(arg, choices):
    shown = choices if "" in choices else ("",) + choices
    raise ValueError(f"unknown variant '{arg}' for configs/{name}.py; choose one of {list(shown)}.")
  return arg


def parse(arg: str | None, choices: Iterable[str], *, name: str,
          exclusive: Iterable[Iterable[str]] = ()) -> list[str]:
  """The comma-separated variants of `arg`, in order, checked against `choices` and `exclusive`.

  Args:
    arg: e.g. 'tiny,p2'; None and '' give []. Empty parts are dropped, spaces around a part are stripped.
    choices: the accepted parts ('' is ignored); a choice 'key=<...>' accepts any part 'key=...'.
    name: the config's slug, e.g. 'mdm' (the error names configs/<name>.py).
    exclusive: groups of choices of which at most one may be given (e.g. the arms of MDM).

  Returns:
    The parts, e.g. ['tiny', 'p2'].

  Raises:
    ValueError: a part is not one of `choices`, or two parts of one `exclusive` group are given; the message
      names the file, the bad part(s) and the choices. A config with `exclusive` groups says 'unknown or
      conflicting variant'.
  """
  parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
  choices = tuple(c for c in choices if c)
  groups = [tuple(g) for g in exclusive]
  unknown = [p for p in parts if not _known(p, choices)]
  clashes = [[p for p in parts if p in g] for g in groups]
  clashes = [c for c in clashes if len(c) > 1]
  if not unknown and not clashes:
    return parts
  what = []
  if unknown:
    what.append("unknown " + ", ".join(repr(p) for p in unknown))
  for c in clashes:
    what.append("at most one of " + ", ".join(repr(p) for p in c))
  rule = "".join(f"; at most one of {list(g)}" for g in groups)
  kind = "unknown or conflicting variant" if groups else "unknown variant"
  detail = f" ({'; '.join(what)})" if len(parts) > 1 else ""
  raise ValueError(f"{kind} '{arg}' for configs/{name}.py{detail}; choose from {list(choices)} "
                   f"(comma-separated{rule}).")
