"""Launcher path for `iclr24_jax/configs/lm.py` (the packaged config): `--config=configs/lm.py[:variant]`."""
from iclr24_jax.configs.lm import *  # noqa: F401,F403
from iclr24_jax.configs.lm import get_config  # noqa: F401
