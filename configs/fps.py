"""Launcher path for `iclr24_jax/configs/fps.py` (the packaged config): `--config=configs/fps.py[:variant]`."""
from iclr24_jax.configs.fps import *  # noqa: F401,F403
from iclr24_jax.configs.fps import get_config  # noqa: F401
