"""Launcher path for `iclr24_jax/configs/pmp.py` (the packaged config): `--config=configs/pmp.py[:variant]`."""
from iclr24_jax.configs.pmp import *  # noqa: F401,F403
from iclr24_jax.configs.pmp import get_config  # noqa: F401
