"""griffe extension: `a, b: description` in an Args section documents both parameters.

The library's docstrings document parameters that share one description on one line (`params, config: the
model.`), a common habit in JAX code that Google style does not define. This splits such lines into one entry
per name before griffe parses the docstring, so every name is still checked against the signature.
"""
from __future__ import annotations

import re

import griffe

_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
_MULTI = re.compile(r"^(\s+)([A-Za-z_*][\w*]*(?:\s*,\s*[A-Za-z_*][\w*]*)+)(\s*(?:\([^)]*\))?\s*:)(.*)$")


def split_multi_args(text: str) -> str:
  """Rewrites `a, b: desc` entries of Args sections as `a: desc` and `b: desc` (continuation lines untouched)."""
  out, in_args, indent, entry = [], False, None, None
  for line in text.splitlines():
    m = _SECTION.match(line)
    if m:
      in_args, indent, entry = True, len(m.group(1)), None
      out.append(line)
      continue
    width = len(line) - len(line.lstrip())
    if in_args and line.strip() and width <= indent:
      in_args = False
    if in_args and line.strip() and entry is None:
      entry = width                  # the first entry sets the entries' indentation
    mm = _MULTI.match(line) if in_args and width == entry else None
    if mm:
      lead, names, colon, rest = mm.groups()
      for name in (n.strip() for n in names.split(",")):
        out.append(f"{lead}{name}{colon}{rest}")
    else:
      out.append(line)
  return "\n".join(out)


class MultiArgs(griffe.Extension):
  """Applies `split_multi_args` to every function's and class's docstring."""

  def on_function_instance(self, *, node, func, agent, **kwargs) -> None:
    del node, agent, kwargs
    if func.docstring is not None:
      func.docstring.value = split_multi_args(func.docstring.value)

  def on_class_instance(self, *, node, cls, agent, **kwargs) -> None:
    del node, agent, kwargs
    if cls.docstring is not None:
      cls.docstring.value = split_multi_args(cls.docstring.value)
