"""Launcher path for `iclr24_jax/configs/motif.py` (the packaged config): `--config=configs/motif.py[:variant]`."""
from iclr24_jax.configs.motif import *  # noqa: F401,F403
from iclr24_jax.configs.motif import get_config  # noqa: F401
