"""Launcher path for `iclr24_jax/configs/unio4.py` (the packaged config): `--config=configs/unio4.py[:variant]`."""
from iclr24_jax.configs.unio4 import *  # noqa: F401,F403
from iclr24_jax.configs.unio4 import get_config  # noqa: F401
