"""Launcher path for `iclr24_jax/configs/lm_inversion.py` (the packaged config): `--config=configs/lm_inversion.py[:variant]`."""
from iclr24_jax.configs.lm_inversion import *  # noqa: F401,F403
from iclr24_jax.configs.lm_inversion import get_config  # noqa: F401
