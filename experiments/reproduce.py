"""From a checkout: `python -m experiments.reproduce ...` = `iclr24 reproduce ...` (`iclr24_jax.launch.reproduce`)."""
import sys

from iclr24_jax.launch.reproduce import *  # noqa: F401,F403  (the module's functions, for `from experiments import reproduce`)
from iclr24_jax.launch.reproduce import main

if __name__ == "__main__":
  sys.exit(main())
