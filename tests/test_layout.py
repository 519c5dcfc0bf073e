"""The test tree mirrors the package: `tests/papers/<slug>/test_<module>.py`, `tests/<family>/test_<module>.py`,
`tests/common/test_<module>.py` and `tests/launch/test_<module>.py` each name a library module, so a change to
`papers/mdm/model.py` runs `tests/papers/mdm/test_model.py` and a change to `launch/run.py` runs
`tests/launch/test_run.py`.

Filesystem only (no JAX): a new test module that names no module, a flat `tests/papers/test_<slug>.py`, a test
folder without `__init__.py` (pytest's default import mode would clash on basenames such as `test_model.py`), a
subprocess worker script that no test beside it launches, a top-level `tests/test_*.py` that is not a test of the
repository as a whole, or a test folder that neither mirrors a package nor is listed as cross-cutting (`contracts`,
`data`) fails here with the path and the fix."""
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "iclr24_jax"
FAMILIES = ("lm", "diffusion", "vision", "rl")
# Library packages outside the papers and families whose tests mirror them the same way.
PACKAGES = ("common", "launch")
# Test modules that may span several library modules: the end-to-end run and the study.
CROSS_MODULE = {"experiment", "study"}
# Python files in a test folder that are not test modules.
SUPPORT = {"__init__.py", "conftest.py", "helpers.py"}
# A script a test runs in a subprocess (multi-process runs, real signals) is `_<what>_worker.py`, beside that test.
WORKER_PREFIX, WORKER_SUFFIX = "_", "_worker.py"
# Top-level test modules: each tests the repository as a whole, not one library module, so it mirrors none.
TOP_LEVEL = {
    "test_layout.py": "this check: the test tree against the package",
    "test_registry.py": "the registry of experiments: every paper package registered, every study and runner "
                        "importable, no undefined name or config import anywhere in the library",
    "test_configs.py": "every packaged config (iclr24_jax/configs/<slug>.py, one per paper and family) builds, and "
                       "their shared variant parser",
    "test_docs.py": "the API reference site (docs/, mkdocs) builds from every public docstring",
}
# Test folders that cut across the package instead of mirroring one part of it, each with its reason. Their test
# modules are named after what they check; the other rules (an __init__.py, shared code in helpers.py, workers
# beside the test that launches them) hold as everywhere.
CROSS_CUTTING = {
    "contracts": "one contract (shapes, empty inputs, non-finite values ...) checked across every public function",
    "data": "the readers of every paper's real data formats, each against a tiny file written in that format",
}
# Files that may sit at the top of tests/ besides the TOP_LEVEL test modules.
TOP_SUPPORT = {"conftest.py"}


def _slugs() -> list[str]:
  return sorted(p.name for p in (PACKAGE / "papers").iterdir() if (p / "__init__.py").is_file())


def _mirrored(test_dir: pathlib.Path, lib_dir: pathlib.Path | None, root: pathlib.Path = ROOT,
              cross_module: frozenset[str] = frozenset(CROSS_MODULE)) -> list[str]:
  """Problems of one test folder against its library package.

  Args:
    test_dir: a folder of test modules, e.g. tests/papers/mdm.
    lib_dir: the library package it mirrors, e.g. iclr24_jax/papers/mdm; None for a CROSS_CUTTING folder (its test
      modules need not name a module).
    root: paths in the messages are relative to it.
    cross_module: test module names (without `test_`) allowed although no library module has them.

  Returns:
    One message per problem, naming the path and the fix; empty when the folder mirrors the package.
  """
  problems = []
  if not (test_dir / "__init__.py").is_file():
    problems.append(f"{test_dir.relative_to(root)} has no __init__.py: add an empty one (basenames such as "
                    f"test_model.py repeat across folders)")
  tests_text = None
  for f in sorted(test_dir.glob("*.py")):
    if f.name in SUPPORT:
      continue
    if f.name.startswith(WORKER_PREFIX) and f.name.endswith(WORKER_SUFFIX):
      if tests_text is None:
        tests_text = "".join(t.read_text() for t in sorted(test_dir.glob("test_*.py")))
      if f"\"{f.name}\"" not in tests_text:
        problems.append(f"{f.relative_to(root)}: no test module beside it launches this worker: move it next to the "
                        f"test that runs it (and fix the path there), or delete it")
      continue
    if not f.name.startswith("test_"):
      problems.append(f"{f.relative_to(root)}: only test_<module>.py, {', '.join(sorted(SUPPORT))} and "
                      f"_<what>_worker.py belong here; move shared code into helpers.py")
      continue
    if lib_dir is None:
      continue
    name = f.stem[len("test_"):]
    module = "__init__" if name == "init" else name      # test_init.py: the package's own API
    if name in cross_module or (lib_dir / f"{module}.py").is_file() or (lib_dir / module / "__init__.py").is_file():
      continue
    also = " / ".join(f"test_{n}.py" for n in sorted(cross_module))
    problems.append(f"{f.relative_to(root)} names no module of {lib_dir.relative_to(root)}: rename it after the "
                    f"module whose functions it tests" + (f" (or {also} for end-to-end tests)" if also else ""))
  return problems


def test_layout_sees_the_packages():
  # The checks below are vacuous if the paths are wrong: the 19 papers and the four families are found.
  assert len(_slugs()) >= 19 and {"mdm", "fps", "cpm"} <= set(_slugs()), _slugs()
  assert all((PACKAGE / fam / "__init__.py").is_file() for fam in FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_tests_name_family_modules(family):
  problems = _mirrored(TESTS / family, PACKAGE / family)
  assert not problems, "\n".join(problems)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_tests_name_package_modules(package):
  # tests/common mirrors iclr24_jax/common and tests/launch iclr24_jax/launch (test_init.py: the `iclr24` command
  # of launch/__init__.py); a test of the launcher's command line sits beside the module the command runs.
  assert (PACKAGE / package / "__init__.py").is_file(), package
  problems = _mirrored(TESTS / package, PACKAGE / package, cross_module=frozenset())   # no end-to-end runs here
  assert not problems, "\n".join(problems)


def test_top_level_tests_are_tests_of_the_whole_repository():
  found = {p.name for p in TESTS.glob("test_*.py")}
  problems = [f"tests/{n} tests no repository-wide concern: move it to tests/<package>/test_<module>.py beside the "
              f"module it tests (or, if it truly spans the repository, list it in TOP_LEVEL with the reason)"
              for n in sorted(found - set(TOP_LEVEL))]
  problems += [f"TOP_LEVEL lists tests/{n}, which does not exist: remove the entry"
               for n in sorted(set(TOP_LEVEL) - found)]
  assert not problems, "\n".join(problems)


@pytest.mark.parametrize("folder", sorted(CROSS_CUTTING))
def test_cross_cutting_folders_follow_the_same_rules(folder):
  problems = _mirrored(TESTS / folder, None)
  assert not problems, "\n".join(problems)


def test_every_test_folder_has_a_place():
  # A folder of tests/ mirrors a family, a package or the papers, or is listed in CROSS_CUTTING with its reason;
  # the top of tests/ holds only TOP_LEVEL test modules and conftest.py (shared code goes in a folder's helpers.py).
  known = set(FAMILIES) | set(PACKAGES) | {"papers"} | set(CROSS_CUTTING)
  folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
  problems = [f"tests/{n}/ mirrors no package: move its tests beside the module they test, or list it in "
              f"CROSS_CUTTING with the reason" for n in sorted(folders - known)]
  problems += [f"CROSS_CUTTING lists tests/{n}/, which does not exist: remove the entry"
               for n in sorted(set(CROSS_CUTTING) - folders)]
  strays = {p.name for p in TESTS.glob("*.py")} - set(TOP_LEVEL) - TOP_SUPPORT
  problems += [f"tests/{n}: only TOP_LEVEL test modules and conftest.py belong at the top of tests/; move shared "
               f"code into the helpers.py of the folder that uses it" for n in sorted(strays)]
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
  for name in ("__init__.py", "conftest.py", "test_model.py", "test_experiment.py", "test_modle.py", "shared.py",
               "_run_worker.py", "_lost_worker.py"):
    (tests / name).write_text("")
  (tests / "test_model.py").write_text('WORKER = os.path.join(HERE, "_run_worker.py")\n')   # launched: fine
  problems = _mirrored(tests, lib, root=tmp_path)
  assert len(problems) == 3, problems
  assert problems[0].startswith("tests/_lost_worker.py: no test module beside it launches this worker")
  assert problems[1].startswith("tests/shared.py: only test_<module>.py")
  assert problems[2].startswith("tests/test_modle.py names no module of lib")
  # A cross-cutting folder (no library package): the same rules except the module names.
  assert _mirrored(tests, None, root=tmp_path) == problems[:2]
  (tests / "__init__.py").unlink()
  assert _mirrored(tests, lib, root=tmp_path)[0].startswith("tests has no __init__.py")
