"""Launcher path for `iclr24_jax/configs/graphcare.py` (the packaged config): `--config=configs/graphcare.py[:variant]`."""
from iclr24_jax.configs.graphcare import *  # noqa: F401,F403
from iclr24_jax.configs.graphcare import get_config  # noqa: F401
