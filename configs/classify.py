"""Launcher path for `iclr24_jax/configs/classify.py` (the packaged config): `--config=configs/classify.py[:variant]`."""
from iclr24_jax.configs.classify import *  # noqa: F401,F403
from iclr24_jax.configs.classify import get_config  # noqa: F401
