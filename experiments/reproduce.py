"""From a checkout: `python -m experiments.reproduce ...` = `iclr24 reproduce ...` (`iclr24_jax.launch.reproduce`).

Imported (`from experiments import reproduce`), this name is the library module itself.
"""
import sys

from iclr24_jax.launch import reproduce as _reproduce

if __name__ == "__main__":
  sys.exit(_reproduce.main())
else:
  sys.modules[__name__] = _reproduce
