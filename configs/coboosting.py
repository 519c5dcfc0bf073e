"""Launcher path for `iclr24_jax/configs/coboosting.py` (the packaged config): `--config=configs/coboosting.py[:variant]`."""
from iclr24_jax.configs.coboosting import *  # noqa: F401,F403
from iclr24_jax.configs.coboosting import get_config  # noqa: F401
