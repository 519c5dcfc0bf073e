"""`python -m iclr24_jax.launch <command> ...` = the `iclr24` console script."""
import sys

from iclr24_jax.launch import main

sys.exit(main())
