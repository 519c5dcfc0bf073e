"""Launcher path for `iclr24_jax/configs/daclip.py` (the packaged config): `--config=configs/daclip.py[:variant]`."""
from iclr24_jax.configs.daclip import *  # noqa: F401,F403
from iclr24_jax.configs.daclip import get_config  # noqa: F401
