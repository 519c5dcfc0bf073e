"""The persistent compilation cache switch (iclr24_jax.common.compile_cache): the environment turns it off or moves
it, and a program compiled once is loaded from the folder (not recompiled) after JAX's in-memory caches are gone."""
import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_switched_off_by_the_environment_leaves_jax_alone(monkeypatch):
  before = (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs)
  for var, value in ((compile_cache.ENV_SWITCH, "0"), (compile_cache.ENV_SWITCH, "off"),
                     (compile_cache.ENV_ROOT, "off")):
    monkeypatch.setenv(var, value)
    assert compile_cache.enable_compilation_cache() is None
    monkeypatch.delenv(var)
  assert (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs) == before


_CHILD = """
import logging, os, sys
sys.path.insert(0, {root!r})
from iclr24_jax.common.compile_cache import enable_compilation_cache
folder = enable_compilation_cache()
import jax, jax.numpy as jnp
hits = []
class Hits(logging.Handler):
  def emit(self, record):
    if "cache hit" in record.getMessage():
      hits.append(record.getMessage())
log = logging.getLogger("jax._src.compiler")
log.setLevel(logging.DEBUG)
log.addHandler(Hits())
f = lambda x: jnp.sin(x) * 2.0 + 1.0      # a tiny program: compiles in milliseconds, cached all the same
jax.jit(f)(jnp.ones(3)).block_until_ready()
jax.clear_caches()                        # forget the in-memory executable: the next call must come from disk
jax.jit(f)(jnp.ones(3)).block_until_ready()
print(folder, jax.config.jax_persistent_cache_min_compile_time_secs, len(hits), len(os.listdir(folder)) > 0)
"""


def test_a_small_program_is_written_and_loaded_from_the_moved_folder(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("ICLR24_JAX", "JAX_COMPILATION"))}
  env[compile_cache.ENV_DIR] = str(tmp_path / "jax")
  out = subprocess.run([sys.executable, "-c", _CHILD.format(root=ROOT)], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  folder, min_time, hits, written = out.stdout.split()
  assert folder == str(tmp_path / "jax") and float(min_time) == 0.0
  assert written == "True" and int(hits) >= 1, out.stderr[-2000:]


def _counting_program():
  """A jitted x * scale + power with a static power, and the list its tracing appends to."""
  traces = []

  @functools.partial(jax.jit, static_argnames=("power",))
  def program(x, scale, power):
    traces.append(power)
    return x ** power * scale + 1.0

  return program, traces


@pytest.fixture
def executables(tmp_path, monkeypatch):
  """`cached_call` writes to tmp_path and starts with nothing in memory (a fresh process)."""
  monkeypatch.setattr(compile_cache, "executable_folder", lambda: str(tmp_path))
  monkeypatch.setattr(compile_cache, "_EXECUTABLES", {})
  return tmp_path


def test_cached_call_keeps_the_executable_on_disk_and_loads_it_without_tracing(tmp_path, executables):
  program, traces = _counting_program()
  x = np.asarray([1.0, 2.0, 3.0], np.float32)
  # [1, 2, 3] ** 2 * 0.5 + 1 = [1.5, 3.0, 5.5]
  np.testing.assert_array_equal(compile_cache.cached_call(program, x, np.float32(0.5), power=2), [1.5, 3.0, 5.5])
  assert traces == [2] and len(list(tmp_path.glob("*.pkl"))) == 1
  compile_cache._EXECUTABLES.clear()              # a new process: nothing in memory, the entry on disk
  np.testing.assert_array_equal(compile_cache.cached_call(program, x, np.float32(0.5), power=2), [1.5, 3.0, 5.5])
  assert traces == [2]                             # loaded whole: not traced again
  # another static argument or shape is another program: [1, 8, 27] * 0.5 + 1 = [1.5, 5, 14.5]
  np.testing.assert_array_equal(compile_cache.cached_call(program, x, np.float32(0.5), power=3), [1.5, 5.0, 14.5])
  np.testing.assert_array_equal(compile_cache.cached_call(program, x[:2], np.float32(0.5), power=3), [1.5, 5.0])
  assert traces == [2, 3, 3] and len(list(tmp_path.glob("*.pkl"))) == 3


def test_cached_call_rewrites_a_broken_entry_and_leaves_device_arrays_to_jit(tmp_path, executables):
  program, _ = _counting_program()
  x = np.asarray([2.0], np.float32)
  compile_cache.cached_call(program, x, np.float32(1.0), power=2)
  (entry,) = tmp_path.glob("*.pkl")
  entry.write_bytes(b"not an executable")
  compile_cache._EXECUTABLES.clear()
  np.testing.assert_array_equal(compile_cache.cached_call(program, x, np.float32(1.0), power=2), [5.0])  # 4 + 1
  assert entry.stat().st_size > 100   # compiled again (lowered from the in-memory trace) and the entry rewritten
  # a device array: the plain jitted call (nothing new on disk)
  np.testing.assert_array_equal(compile_cache.cached_call(program, jnp.asarray(x), np.float32(1.0), power=2), [5.0])
  assert len(list(tmp_path.glob("*.pkl"))) == 1


def test_cached_call_writes_nothing_while_the_cache_is_off(tmp_path, monkeypatch):
  monkeypatch.setenv(compile_cache.ENV_SWITCH, "0")
  monkeypatch.setattr(compile_cache, "_EXECUTABLES", {})
  assert compile_cache.executable_folder() is None
  program, _ = _counting_program()
  np.testing.assert_array_equal(
      compile_cache.cached_call(program, np.asarray([3.0], np.float32), np.float32(2.0), power=1), [7.0])  # 6 + 1
  assert not list(tmp_path.iterdir())


def test_cached_call_keeps_python_callbacks_in_memory_only(tmp_path, executables):
  program = jax.jit(lambda x: jax.pure_callback(lambda v: np.asarray(v) * 3.0, jax.ShapeDtypeStruct((2,), jnp.float32),
                                                x))
  np.testing.assert_array_equal(compile_cache.cached_call(program, np.asarray([1.0, 2.0], np.float32)), [3.0, 6.0])
  assert not list(tmp_path.glob("*.pkl"))   # a callback points into this process: never written


_LAPACK_CHILD = """
import sys
sys.path.insert(0, {root!r})
from iclr24_jax.common import compile_cache
compile_cache.enable_compilation_cache()
import jax, numpy as np
solve = jax.jit(lambda a, b: jax.numpy.linalg.solve(a, b))
a = np.asarray([[2.0, 1.0], [1.0, 3.0]], np.float32)
x = compile_cache.cached_call(solve, a, np.asarray([3.0, 5.0], np.float32))
print(len(compile_cache._EXECUTABLES), *np.round(np.asarray(x), 5))
"""


def test_a_lapack_program_loads_whole_in_a_fresh_process(tmp_path):
  # The second process loads the LU solve without lowering anything: jaxlib's LAPACK pointers must be filled
  # by the loader (before that fix the call crashed the process).
  env = {k: v for k, v in os.environ.items() if not k.startswith(("ICLR24_JAX", "JAX_COMPILATION"))}
  env[compile_cache.ENV_DIR] = str(tmp_path / "jax")
  outs = []
  for _ in range(2):
    out = subprocess.run([sys.executable, "-c", _LAPACK_CHILD.format(root=ROOT)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    outs.append(out.stdout.split())
    errs = out.stderr
  assert len(list((tmp_path / "jax" / "executables").glob("*.pkl"))) == 1
  assert "could lead to execution errors such as SIGILL" not in errs   # the load's known noise is dropped
  # [[2, 1], [1, 3]] x = [3, 5]: x = (3 * 3 - 5, 2 * 5 - 3) / 5 = (0.8, 1.4)
  assert outs[0] == outs[1] == ["1", "0.8", "1.4"]


def test_loader_noise_is_dropped_and_every_other_line_kept(capfd):
  noise = ("E1204 15:51:26.0 575 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature "
           "+prefer-no-gather is not  supported on the host machine. ... such as SIGILL.\n")
  real = ("E1204 15:51:26.0 575 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature "
          "+avx512fp16 is not  supported on the host machine.\n")
  with compile_cache._known_loader_noise_dropped():
    os.write(2, noise.encode() + b"W pjrt_executable.cc:642] Assume version compatibility. ...\n"
             + real.encode() + b"other\n")
  assert capfd.readouterr().err == real + "other\n"


def test_the_executables_folder_is_pruned_least_recently_used_first(tmp_path, monkeypatch):
  # four 1 MB entries, used in the order a, b, c, d (mtimes 1..4 s); a cap of 2.5 MB keeps the two newest
  for i, name in enumerate("abcd"):
    path = tmp_path / f"{name}.pkl"
    path.write_bytes(b"x" * 1_000_000)
    os.utime(path, ns=((i + 1) * 10**9, (i + 1) * 10**9))
  (tmp_path / "other.tmp").write_bytes(b"x" * 5_000_000)   # not an entry: never counted or deleted
  assert compile_cache.prune_executables(str(tmp_path), max_mb=2.5) == 2
  assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pkl", "d.pkl", "other.tmp"]
  monkeypatch.setenv(compile_cache.ENV_EXECUTABLES_MB, "lots")
  with pytest.raises(ValueError, match="ICLR24_JAX_EXECUTABLES_MAX_MB='lots': expected a number"):
    compile_cache.prune_executables(str(tmp_path))
  monkeypatch.setenv(compile_cache.ENV_EXECUTABLES_MB, "0")
  assert compile_cache.prune_executables(str(tmp_path)) == 2 and [p.name for p in tmp_path.iterdir()] == ["other.tmp"]


def test_a_load_marks_the_entry_recently_used(tmp_path, executables):
  program, _ = _counting_program()
  x = np.asarray([1.0], np.float32)
  compile_cache.cached_call(program, x, np.float32(1.0), power=2)
  (entry,) = tmp_path.glob("*.pkl")
  os.utime(entry, ns=(10**9, 10**9))               # as if written long ago
  compile_cache._EXECUTABLES.clear()
  compile_cache.cached_call(program, x, np.float32(1.0), power=2)   # loaded from disk
  assert entry.stat().st_mtime_ns > 10**9


def test_cache_root_is_the_one_root_of_every_cache(monkeypatch, tmp_path):
  """Every cache of the library (compiled programs, converted LM weights, the native kernel, cpm's scores, fps's
  prior, rl's data sets) lives under `cache_root`; ICLR24_JAX_CACHE moves it and its off values turn it off."""
  from iclr24_jax.lm import weights
  from iclr24_jax.papers.fps import model as fps_model
  from iclr24_jax.rl import offline
  monkeypatch.delenv("ICLR24_RL_CACHE", raising=False)
  monkeypatch.setenv(compile_cache.ENV_ROOT, str(tmp_path))
  assert compile_cache.cache_root() == str(tmp_path)
  assert weights.cache_dir() == tmp_path and fps_model.cache_dir() == str(tmp_path / "fps")
  assert offline.default_cache_dir() == tmp_path / "rl"
  for off in ("off", "0", "None"):
    monkeypatch.setenv(compile_cache.ENV_ROOT, off)
    assert compile_cache.cache_root() is None and weights.cache_dir() is None and fps_model.cache_dir() is None
    assert compile_cache.enable_compilation_cache() is None
    assert not str(offline.default_cache_dir()).startswith(off)
  monkeypatch.delenv(compile_cache.ENV_ROOT)
  assert compile_cache.cache_root() == os.path.join(os.path.expanduser("~"), ".cache", "iclr24_jax")
