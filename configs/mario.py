"""Launcher path for `iclr24_jax/configs/mario.py` (the packaged config): `--config=configs/mario.py[:variant]`."""
from iclr24_jax.configs.mario import *  # noqa: F401,F403
from iclr24_jax.configs.mario import get_config  # noqa: F401
