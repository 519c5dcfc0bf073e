"""From a checkout: `python -m experiments.scale ...` = `iclr24 scale ...` (`iclr24_jax.launch.scale`).

Imported (`from experiments import scale`), this name is the library module itself.
"""
import sys

from iclr24_jax.launch import scale as _scale

if __name__ == "__main__":
  sys.exit(_scale.main())
else:
  sys.modules[__name__] = _scale
