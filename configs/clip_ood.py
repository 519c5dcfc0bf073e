"""Launcher path for `iclr24_jax/configs/clip_ood.py` (the packaged config): `--config=configs/clip_ood.py[:variant]`."""
from iclr24_jax.configs.clip_ood import *  # noqa: F401,F403
from iclr24_jax.configs.clip_ood import get_config  # noqa: F401
