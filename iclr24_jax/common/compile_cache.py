"""JAX's persistent compilation cache for the project's entry points.

A program compiled once is written to disk and loaded, not recompiled, by later processes: the launcher
(`experiments/main.py`), `experiments.reproduce`, `experiments.benchmark` and the test run (`tests/conftest.py`)
call `enable_compilation_cache()` before they compile anything. Library functions never turn it on by
themselves (importing a function should not write to a user's home).

  folder   $ICLR24_JAX_COMPILATION_CACHE_DIR, else $ICLR24_JAX_CACHE/jax (the project's cache root), else
           ~/.cache/iclr24_jax/jax; a folder the user gave JAX itself (JAX_COMPILATION_CACHE_DIR, or
           jax.config's jax_compilation_cache_dir) wins and is left alone.
  off      ICLR24_JAX_COMPILATION_CACHE=0 (or off / false / no / none), or ICLR24_JAX_CACHE=off (every
           cache of the project off, as `lm.weights` reads it).

`cached_call(jitted, *host_args, **static)` goes one step further for small programs whose first call is mostly
tracing and lowering (which JAX's cache cannot skip): it keeps the whole executable, in the process and, while the
cache is on, in `executables/` inside the cache folder, keyed by the package's source files, the versions, the
devices, the host CPU and the arguments' shapes / dtypes / static values. Every edit of the package's sources
changes that key, so the folder is kept to $ICLR24_JAX_EXECUTABLES_MAX_MB (default 256 MB): after each write the
least recently used entries (by modification time, which a load refreshes) go first.

Every program is cached, whatever its compile time (JAX's default writes only programs that took over 1 s, which
skips the many small programs of a test run). Entries are keyed by the program, the JAX / XLA versions, the
devices and the compile options; on a cluster whose nodes differ in CPU, point the folder at node-local disk.
XLA:CPU (jaxlib 0.9) logs an error line for each entry it loads on CPUs whose LLVM tuning flags it mistakes for
missing features ("Target machine feature +prefer-no-gather is not supported", openxla/xla#44565; seen on this
project's AMD EPYC machines); the entry is used all the same. TF_CPP_MIN_LOG_LEVEL=3 silences it (and every other
C++ error line).
"""
from __future__ import annotations

import contextlib
import functools
import os
import re

ENV_SWITCH = "ICLR24_JAX_COMPILATION_CACHE"
ENV_DIR = "ICLR24_JAX_COMPILATION_CACHE_DIR"
ENV_ROOT = "ICLR24_JAX_CACHE"
ENV_EXECUTABLES_MB = "ICLR24_JAX_EXECUTABLES_MAX_MB"
DEFAULT_EXECUTABLES_MB = 256
OFF_VALUES = ("0", "off", "false", "no", "none")


def cache_root() -> str | None:
  """The project's cache root, which every cache of the library lives under: $ICLR24_JAX_CACHE, else
  ~/.cache/iclr24_jax; None when $ICLR24_JAX_CACHE is off (0 / off / false / no / none)."""
  env = os.environ.get(ENV_ROOT, "").strip()
  if env.lower() in OFF_VALUES and env:
    return None
  return env or os.path.join(os.path.expanduser("~"), ".cache", "iclr24_jax")


def enable_compilation_cache(path: str | None = None) -> str | None:
  """Turns on JAX's persistent compilation cache (see the module docstring for the folder and the switches).

  Call it before the first compilation: JAX decides once per process, at its first compile, whether to use the
  cache (it is reset here, so a later call still takes effect for the programs compiled after it).

  Args:
    path: the cache folder; default $ICLR24_JAX_COMPILATION_CACHE_DIR, else $ICLR24_JAX_CACHE/jax, else
      ~/.cache/iclr24_jax/jax.

  Returns:
    The folder in use, or None when the cache is switched off by the environment.
  """
  root = cache_root()
  if os.environ.get(ENV_SWITCH, "").strip().lower() in OFF_VALUES or root is None:
    return None
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  folder = jax.config.jax_compilation_cache_dir   # set by the user through JAX: theirs
  if not folder:
    folder = path or os.environ.get(ENV_DIR) or os.path.join(root, "jax")
    os.makedirs(folder, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  compilation_cache.reset_cache()   # re-read the settings at the next compile, even after an earlier one
  return folder


# ----------------------------------------------------------------------------------------------------------------
# Whole executables on disk: a later process skips tracing and lowering too.

_EXECUTABLES: dict[str, object] = {}   # key -> compiled executable (this process)
_SOURCE_DIGEST: list[str] = []


def _source_digest() -> str:
  """A digest of every .py file of the installed iclr24_jax package by path, size and modification time (what
  Python's own bytecode cache checks): any edit of the code is a new key."""
  if not _SOURCE_DIGEST:
    import hashlib
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
      dirs.sort()
      for name in sorted(files):
        if name.endswith(".py"):
          st = os.stat(os.path.join(folder, name))
          h.update(f"{os.path.relpath(os.path.join(folder, name), root)}:{st.st_size}:{st.st_mtime_ns};".encode())
    _SOURCE_DIGEST.append(h.hexdigest())
  return _SOURCE_DIGEST[0]


@functools.lru_cache(maxsize=None)
def _machine() -> str:
  """The host CPU's feature flags (an XLA:CPU executable is built for them)."""
  try:
    with open("/proc/cpuinfo") as fh:
      return next((line for line in fh if line.startswith(("flags", "Features"))), "")
  except OSError:
    import platform
    return platform.processor()


def executable_folder() -> str | None:
  """Where `cached_call` keeps executables: `executables/` inside JAX's compilation-cache folder, or None while
  that cache is off (`enable_compilation_cache` not called, or switched off by the environment)."""
  import jax
  folder = jax.config.jax_compilation_cache_dir
  if not folder or not jax.config.jax_enable_compilation_cache:
    return None
  if (os.environ.get(ENV_SWITCH, "").strip().lower() in OFF_VALUES
      or os.environ.get(ENV_ROOT, "").strip().lower() in OFF_VALUES):
    return None
  return os.path.join(folder, "executables")


def cached_call(jitted, *args, **static_kwargs):
  """`jitted(*args, **static_kwargs)`, its executable kept whole: in this process and, while the compilation
  cache is on, on disk (`executable_folder()`), so that a later process loads it without tracing, lowering or
  compiling. JAX's own cache starts only after the tracing and lowering, which cost a small program's first call
  most of its time (D2's selection: ~0.2 of 0.25 CPU s). Falls back to the plain call for anything but host
  (numpy) arguments, and where an executable cannot be stored or loaded.

  The key holds the function's module and name, a digest of the package's source files (path, size, mtime), the
  JAX / jaxlib versions, the backend, its devices, the default device and the host CPU's features, jax_enable_x64,
  every argument's shape and dtype and the static arguments' reprs. Only programs whose custom calls are XLA's TopK
  or jaxlib's LAPACK kernels go to disk (others stay in memory). An entry is a pickle of
  `jax.experimental.serialize_executable.serialize` (JAX pickles the executable itself the same way): load one
  only from a folder you trust, as with JAX's own cache.

  Args:
    jitted: a `jax.jit`-wrapped function whose static arguments are all passed by keyword.
    *args: its array arguments: numpy arrays, numpy scalars or None.
    **static_kwargs: its static arguments (hashable; part of the key by repr).

  Returns:
    what `jitted(*args, **static_kwargs)` returns.
  """
  import numpy as np
  if not all(a is None or isinstance(a, (np.ndarray, np.generic)) for a in args):
    return jitted(*args, **static_kwargs)
  import hashlib
  import jax
  try:
    import jaxlib
    backend = jax.default_backend()
    devices = jax.devices()
    parts = (getattr(jitted, "__module__", ""), getattr(jitted, "__qualname__", repr(jitted)), _source_digest(),
             jax.__version__, jaxlib.__version__, backend, len(devices), devices[0].device_kind, _machine(),
             repr(jax.config.jax_default_device),
             bool(jax.config.jax_enable_x64), [None if a is None else (a.shape, a.dtype.str) for a in args],
             sorted((k, repr(v)) for k, v in static_kwargs.items()))
  except Exception:  # noqa: BLE001  (no key, no cache: the plain call)
    return jitted(*args, **static_kwargs)
  key = hashlib.sha256(repr(parts).encode()).hexdigest()
  compiled = _EXECUTABLES.get(key)
  if compiled is None:
    compiled = _load(key)
  if compiled is None:
    compiled = _compile_fresh(jitted.lower(*args, **static_kwargs))
    _store(key, compiled)
  _EXECUTABLES[key] = compiled
  return compiled(*args)


def _compile_fresh(lowered):
  """`lowered.compile()` past JAX's persistent cache: jaxlib 0.9's XLA:CPU cannot serialize again an executable it
  loaded from that cache (the copy fails at run time: "Function ... not found"), so an executable kept whole must
  come from a compilation. JAX's own cache stays as it was for every other program."""
  folder = executable_folder()
  if folder is None:
    return lowered.compile()
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    return lowered.compile()
  finally:
    jax.config.update("jax_enable_compilation_cache", True)
    compilation_cache.reset_cache()


# Custom calls an executable kept on disk may hold: XLA's own TopK, and jaxlib's LAPACK kernels, whose function
# pointers jaxlib fills only while lowering a linear-algebra op (`_load` fills them first: without that a loaded
# LU or triangular solve crashes the process). Anything else (a Python callback, another library's kernel) may
# depend on state of the process that compiled it: such a program stays in memory only.
_STORABLE_CUSTOM_CALLS = re.compile(r"TopK|lapack_\w+")


def _custom_calls(compiled) -> set[str] | None:
  """The custom-call targets of a compiled program (None where its text cannot be read)."""
  try:
    return set(re.findall(r'custom_call_target="([^"]+)"', compiled.as_text()))
  except Exception:  # noqa: BLE001
    return None


def _load(key: str):
  folder = executable_folder()
  path = folder and os.path.join(folder, key + ".pkl")
  if not path or not os.path.exists(path):
    return None
  try:
    import pickle
    import numpy as np
    from jax.experimental import serialize_executable
    from jaxlib import lapack
    with open(path, "rb") as fh:
      payload, in_tree, out_tree, device_ids, uses_lapack = pickle.load(fh)
    if uses_lapack:   # ~0.1 s (scipy's LAPACK): only for the programs that call it
      lapack.prepare_lapack_call("getrf_ffi", np.float32)   # fills jaxlib's LAPACK pointers (see above)
    import jax
    by_id = {d.id: d for d in jax.devices()}
    with _known_loader_noise_dropped():
      compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                           execution_devices=[by_id[i] for i in device_ids])
    with contextlib.suppress(OSError):
      os.utime(path)   # recently used: the last to be pruned
    return compiled
  except Exception:  # noqa: BLE001  (a stale or unreadable entry: compiled again and rewritten)
    return None


# What XLA logs on every load of an executable it compiled on this very machine: its target features include the
# tuning flags prefer-no-gather / prefer-no-scatter, which the host's feature list never names, so the loader
# warns of SIGILL for each; and PjRt cannot check executable versions (the key holds the jaxlib version). A line
# naming any other feature (a real mismatch) or anything else passes through.
_KNOWN_LOADER_NOISE = re.compile(
    r"cpu_aot_loader\.cc:\d+\] Loading XLA:CPU AOT result\. Target machine feature \+prefer-no-(gather|scatter) "
    r"is not|pjrt_executable\.cc:\d+\] Assume version compatibility")


@contextlib.contextmanager
def _known_loader_noise_dropped():
  """Runs its block with file descriptor 2 in a temporary file, then writes back every line but the known loader
  noise (`_KNOWN_LOADER_NOISE`; a few KB per load otherwise). The redirection holds only while an executable loads
  (milliseconds); another thread's stderr in that window is delayed, not lost."""
  import sys
  import tempfile
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError):   # no file descriptor 2 (an embedded interpreter): nothing to filter
    yield
    return
  with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      kept = [line for line in tmp.read().decode(errors="replace").splitlines(keepends=True)
              if not _KNOWN_LOADER_NOISE.search(line)]
      if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def _store(key: str, compiled) -> None:
  folder = executable_folder()
  targets = _custom_calls(compiled) if folder else None
  if targets is None or not all(_STORABLE_CUSTOM_CALLS.fullmatch(t) for t in targets):
    return
  try:
    import pickle
    import tempfile
    from jax.experimental import serialize_executable
    import jax
    # the devices it was compiled for (a host call runs on the default device, not on every device)
    device_ids = sorted(d.id for d in jax.tree.leaves(compiled.output_shardings)[0].device_set)
    uses_lapack = any(t.startswith("lapack_") for t in targets)
    blob = pickle.dumps((*serialize_executable.serialize(compiled), device_ids, uses_lapack))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
      fh.write(blob)
    os.replace(tmp, os.path.join(folder, key + ".pkl"))   # atomic: a reader never sees half an entry
  except Exception:  # noqa: BLE001  (not storable: this process still has it)
    return
  prune_executables(folder)


def prune_executables(folder: str | None = None, max_mb: float | None = None) -> int:
  """Deletes the least recently used `cached_call` entries until `folder` holds at most `max_mb` megabytes.

  Args:
    folder: the executables folder (default `executable_folder()`; nothing happens while it is None).
    max_mb: the cap (default $ICLR24_JAX_EXECUTABLES_MAX_MB, else 256); 0 empties the folder.

  Returns:
    the number of entries deleted.
  """
  folder = folder or executable_folder()
  if not folder or not os.path.isdir(folder):
    return 0
  if max_mb is None:
    raw = os.environ.get(ENV_EXECUTABLES_MB, "").strip()
    try:
      max_mb = float(raw) if raw else DEFAULT_EXECUTABLES_MB
    except ValueError:
      raise ValueError(f"{ENV_EXECUTABLES_MB}={raw!r}: expected a number of megabytes (e.g. 256)") from None
  entries = []
  for name in os.listdir(folder):
    if name.endswith(".pkl"):
      with contextlib.suppress(OSError):   # another process may delete it meanwhile
        st = os.stat(os.path.join(folder, name))
        entries.append((st.st_mtime_ns, st.st_size, name))
  total, cap, removed = sum(e[1] for e in entries), max_mb * 1e6, 0
  for _, size, name in sorted(entries):   # oldest first
    if total <= cap:
      break
    with contextlib.suppress(OSError):
      os.remove(os.path.join(folder, name))
      removed += 1
    total -= size
  return removed
