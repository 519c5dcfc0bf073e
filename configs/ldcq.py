"""Launcher path for `iclr24_jax/configs/ldcq.py` (the packaged config): `--config=configs/ldcq.py[:variant]`."""
from iclr24_jax.configs.ldcq import *  # noqa: F401,F403
from iclr24_jax.configs.ldcq import get_config  # noqa: F401
