"""mkdocs hook: generates the reference pages (one per family and per paper) from the package itself.

Each page is the package's README (relative links to files outside the site become plain text, links to other
packages' READMEs become links to their pages) followed by `::: module` blocks for the names in `__all__`; for
`common`, which has no `__all__`, one block per module. Nothing generated is written into the repository.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import re

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("common", "vision", "diffusion", "lm", "rl")
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _papers() -> list[str]:
  from iclr24_jax import registry
  return list(registry.PAPERS)


def _page_of(target: str, here: str) -> str | None:
  """The generated page a README link points to, or None (a file outside the site)."""
  path = os.path.normpath(os.path.join(here, target.split("#")[0]))
  rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
  m = re.fullmatch(r"iclr24_jax/papers/([a-z0-9_]+)(/README\.md)?/?", rel)
  if m:
    return f"papers/{m.group(1)}.md"
  m = re.fullmatch(r"iclr24_jax/([a-z]+)(/README\.md)?/?", rel)
  if m and m.group(1) in FAMILIES:
    return f"families/{m.group(1)}.md"
  return None


def _rewrite_links(text: str, here: str, page: str) -> str:
  def sub(m):
    bang, label, target = m.groups()
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
      return m.group(0)
    dest = _page_of(target, here)
    if dest is None or bang:
      return f"`{label}`" if not bang else f"({label})"
    return f"[{label}]({os.path.relpath(dest, os.path.dirname(page))})"
  return _LINK.sub(sub, text)


def _readme(path: str, page: str) -> str:
  if not os.path.exists(path):
    return ""
  with open(path) as f:
    return _rewrite_links(f.read(), os.path.dirname(path), page)


def _reference(module_name: str) -> str:
  module = importlib.import_module(module_name)
  names = [n for n in getattr(module, "__all__", []) if not isinstance(getattr(module, n, None), type(module))]
  if names:
    members = "\n".join(f"        - {n}" for n in names)
    return f"## API reference\n\n::: {module_name}\n    options:\n      members:\n{members}\n"
  parts = ["## API reference\n"]
  for info in pkgutil.iter_modules(module.__path__):
    if not info.name.startswith("_") and not info.ispkg:
      parts.append(f"### `{module_name}.{info.name}`\n\n::: {module_name}.{info.name}\n")
  return "\n".join(parts)


def _pages() -> dict[str, str]:
  pages = {"index.md": _readme(os.path.join(ROOT, "README.md"), "index.md")}
  for fam in FAMILIES:
    page = f"families/{fam}.md"
    top = _readme(os.path.join(ROOT, "iclr24_jax", fam, "README.md"), page)
    if not top:
      doc = importlib.import_module(f"iclr24_jax.{fam}").__doc__ or ""
      top = f"# iclr24_jax.{fam}\n\n{doc}\n"
    pages[page] = top + "\n\n" + _reference(f"iclr24_jax.{fam}")
  for slug in _papers():
    page = f"papers/{slug}.md"
    pages[page] = _readme(os.path.join(ROOT, "iclr24_jax", "papers", slug, "README.md"), page) + "\n\n" + \
        _reference(f"iclr24_jax.papers.{slug}")
  return pages


def on_config(config):
  nav = [{"Home": "index.md"},
         {"Families": [{fam: f"families/{fam}.md"} for fam in FAMILIES]},
         {"Papers": [{slug: f"papers/{slug}.md"} for slug in _papers()]}]
  config["nav"] = nav
  return config


def on_files(files, config):
  for src_uri, content in _pages().items():
    files.append(File.generated(config, src_uri, content=content))
  return files
