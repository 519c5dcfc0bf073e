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

Every program is cached, whatever its compile time (JAX's default writes only programs that took over 1 s, which
skips the many small programs of a test run). Entries are keyed by the program, the JAX / XLA versions, the
devices and the compile options; on a cluster whose nodes differ in CPU, point the folder at node-local disk.
XLA:CPU (jaxlib 0.9) logs an error line for each entry it loads on CPUs whose LLVM tuning flags it mistakes for
missing features ("Target machine feature +prefer-no-gather is not supported", openxla/xla#44565; seen on this
project's AMD EPYC machines); the entry is used all the same. TF_CPP_MIN_LOG_LEVEL=3 silences it (and every other
C++ error line).
"""
from __future__ import annotations

import os

ENV_SWITCH = "ICLR24_JAX_COMPILATION_CACHE"
ENV_DIR = "ICLR24_JAX_COMPILATION_CACHE_DIR"
ENV_ROOT = "ICLR24_JAX_CACHE"
_OFF = ("0", "off", "false", "no", "none")


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
  if (os.environ.get(ENV_SWITCH, "").strip().lower() in _OFF
      or os.environ.get(ENV_ROOT, "").strip().lower() in _OFF):
    return None
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  folder = jax.config.jax_compilation_cache_dir   # set by the user through JAX: theirs
  if not folder:
    root = os.environ.get(ENV_ROOT) or os.path.join(os.path.expanduser("~"), ".cache", "iclr24_jax")
    folder = path or os.environ.get(ENV_DIR) or os.path.join(root, "jax")
    os.makedirs(folder, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  compilation_cache.reset_cache()   # re-read the settings at the next compile, even after an earlier one
  return folder
