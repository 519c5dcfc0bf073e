"""Launcher path for `iclr24_jax/configs/cdgm.py` (the packaged config): `--config=configs/cdgm.py[:variant]`."""
from iclr24_jax.configs.cdgm import *  # noqa: F401,F403
from iclr24_jax.configs.cdgm import get_config  # noqa: F401
