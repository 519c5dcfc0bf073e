"""Launcher path for `iclr24_jax/configs/mdm.py` (the packaged config): `--config=configs/mdm.py[:variant]`."""
from iclr24_jax.configs.mdm import *  # noqa: F401,F403
from iclr24_jax.configs.mdm import get_config  # noqa: F401
