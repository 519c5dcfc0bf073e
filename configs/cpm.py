"""Launcher path for `iclr24_jax/configs/cpm.py` (the packaged config): `--config=configs/cpm.py[:variant]`."""
from iclr24_jax.configs.cpm import *  # noqa: F401,F403
from iclr24_jax.configs.cpm import get_config  # noqa: F401
