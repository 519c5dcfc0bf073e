"""From a checkout: `python -m experiments.benchmark ...` = `iclr24 benchmark ...` (`iclr24_jax.launch.benchmark`)."""
import sys

from iclr24_jax.launch.benchmark import main

if __name__ == "__main__":
  sys.exit(main())
