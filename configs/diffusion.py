"""Launcher path for `iclr24_jax/configs/diffusion.py` (the packaged config): `--config=configs/diffusion.py[:variant]`."""
from iclr24_jax.configs.diffusion import *  # noqa: F401,F403
from iclr24_jax.configs.diffusion import get_config  # noqa: F401
