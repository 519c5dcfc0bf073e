"""Launcher path for `iclr24_jax/configs/nci.py` (the packaged config): `--config=configs/nci.py[:variant]`."""
from iclr24_jax.configs.nci import *  # noqa: F401,F403
from iclr24_jax.configs.nci import get_config  # noqa: F401
