"""From a checkout: `python -m experiments.benchmark ...` = `iclr24 benchmark ...` (`iclr24_jax.launch.benchmark`).

Imported (`from experiments import benchmark`), this name is the library module itself.
"""
import sys

from iclr24_jax.launch import benchmark as _benchmark

if __name__ == "__main__":
  sys.exit(_benchmark.main())
else:
  sys.modules[__name__] = _benchmark
