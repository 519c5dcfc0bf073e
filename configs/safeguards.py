"""Launcher path for `iclr24_jax/configs/safeguards.py` (the packaged config): `--config=configs/safeguards.py[:variant]`."""
from iclr24_jax.configs.safeguards import *  # noqa: F401,F403
from iclr24_jax.configs.safeguards import get_config  # noqa: F401
