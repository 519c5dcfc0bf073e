"""From a checkout: `python -m experiments.reproduce ...` = `iclr24 reproduce ...` (`iclr24_jax.launch.reproduce`)."""
import sys

from iclr24_jax.launch.reproduce import main

if __name__ == "__main__":
  sys.exit(main())
