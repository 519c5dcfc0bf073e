"""From a checkout: `python -m experiments.main --config=configs/pmp.py:tiny --workdir=runs/pmp` = `iclr24 run ...`.

The launcher lives in the library (`iclr24_jax.launch.run`), so an installed copy has it as the `iclr24` command.
"""
import sys

from iclr24_jax.launch.run import main

if __name__ == "__main__":
  sys.exit(main(sys.argv))
