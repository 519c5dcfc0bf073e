"""The test tree mirrors the package: `tests/papers/<slug>/test_<module>.py` and `tests/<family>/test_<module>.py`
each name a library module, so a change to `papers/mdm/model.py` runs `tests/papers/mdm/test_model.py`.

Filesystem only (no JAX): a new test module that names no module, a flat `tests/papers/test_<slug>.py`, or a test
folder without `__init__.py` (pytest's default import mode would clash on basenames such as `test_model.py`) fails
here with the path and the fix."""
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "iclr24_jax"
FAMILIES = ("lm", "diffusion", "vision", "rl")
# Test modules that may span several library modules: the end-to-end run and the study.
CROSS_MODULE = {"experiment", "study"}
# Python files in a test folder that are not test modules.
SUPPORT = {"__init__.py", "conftest.py", "helpers.py"}


def _slugs() -> list[str]:
  return sorted(p.name for p in (PACKAGE / "papers").iterdir() if (p / "__init__.py").is_file())


def _mirrored(test_dir: pathlib.Path, lib_dir: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
  """Problems of one test folder against its library package.

  Args:
    test_dir: a folder of test modules, e.g. tests/papers/mdm.
    lib_dir: the library package it mirrors, e.g. iclr24_jax/papers/mdm.
    root: paths in the messages are relative to it.

  Returns:
    One message per problem, naming the path and the fix; empty when the folder mirrors the package.
  """
  problems = []
  if not (test_dir / "__init__.py").is_file():
    problems.append(f"{test_dir.relative_to(root)} has no __init__.py: add an empty one (basenames such as "
                    f"test_model.py repeat across folders)")
  for f in sorted(test_dir.glob("*.py")):
    if f.name in SUPPORT:
      continue
    if not f.name.startswith("test_"):
      problems.append(f"{f.relative_to(root)}: only test_<module>.py, {', '.join(sorted(SUPPORT))} belong here; "
                      f"move shared code into helpers.py")
      continue
    name = f.stem[len("test_"):]
    module = "__init__" if name == "init" else name      # test_init.py: the package's own API
    if name in CROSS_MODULE or (lib_dir / f"{module}.py").is_file() or (lib_dir / module / "__init__.py").is_file():
      continue
    problems.append(f"{f.relative_to(root)} names no module of {lib_dir.relative_to(root)}: rename it after the "
                    f"module whose functions it tests (or test_experiment.py / test_study.py for end-to-end tests)")
  return problems


def test_layout_sees_the_packages():
  # The checks below are vacuous if the paths are wrong: the 19 papers and the four families are found.
  assert len(_slugs()) >= 19 and {"mdm", "fps", "cpm"} <= set(_slugs()), _slugs()
  assert all((PACKAGE / fam / "__init__.py").is_file() for fam in FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_tests_name_family_modules(family):
  problems = _mirrored(TESTS / family, PACKAGE / family)
  assert not problems, "\n".join(problems)


def test_paper_tests_name_paper_modules():
  flat = sorted(p.name for p in (TESTS / "papers").glob("test_*.py"))
  problems = [f"tests/papers/{n}: split it into tests/papers/<slug>/test_<module>.py" for n in flat]
  for slug in _slugs():
    test_dir = TESTS / "papers" / slug
    if not test_dir.is_dir():
      problems.append(f"iclr24_jax/papers/{slug} has no tests/papers/{slug}/ folder")
      continue
    problems += _mirrored(test_dir, PACKAGE / "papers" / slug)
  strays = sorted(p.name for p in (TESTS / "papers").iterdir()
                  if p.is_dir() and p.name != "__pycache__" and p.name not in _slugs())
  problems += [f"tests/papers/{n}/ names no paper package" for n in strays]
  assert not problems, "\n".join(problems)


def test_the_check_names_a_stray_module(tmp_path):
  # A folder with two good, one unmatched and one non-test file, against a fake package: exactly the two bad ones.
  lib, tests = tmp_path / "lib", tmp_path / "tests"
  lib.mkdir()
  tests.mkdir()
  (lib / "model.py").write_text("")
  for name in ("__init__.py", "conftest.py", "test_model.py", "test_experiment.py", "test_modle.py", "shared.py"):
    (tests / name).write_text("")
  problems = _mirrored(tests, lib, root=tmp_path)
  assert len(problems) == 2, problems
  assert problems[0].startswith("tests/shared.py: only test_<module>.py")
  assert problems[1].startswith("tests/test_modle.py names no module of lib")
  (tests / "__init__.py").unlink()
  assert _mirrored(tests, lib, root=tmp_path)[0].startswith("tests has no __init__.py")
