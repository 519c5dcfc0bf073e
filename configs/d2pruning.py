"""Launcher path for `iclr24_jax/configs/d2pruning.py` (the packaged config): `--config=configs/d2pruning.py[:variant]`."""
from iclr24_jax.configs.d2pruning import *  # noqa: F401,F403
from iclr24_jax.configs.d2pruning import get_config  # noqa: F401
