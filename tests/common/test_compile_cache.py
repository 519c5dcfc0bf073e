"""The persistent compilation cache switch (iclr24_jax.common.compile_cache): the environment turns it off or moves
it, and a program compiled once is loaded from the folder (not recompiled) after JAX's in-memory caches are gone."""
import os
import subprocess
import sys

import jax

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
