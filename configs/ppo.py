"""Launcher path for `iclr24_jax/configs/ppo.py` (the packaged config): `--config=configs/ppo.py[:variant]`."""
from iclr24_jax.configs.ppo import *  # noqa: F401,F403
from iclr24_jax.configs.ppo import get_config  # noqa: F401
