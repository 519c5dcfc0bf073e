"""Launcher path for `iclr24_jax/configs/finetune_dissect.py` (the packaged config): `--config=configs/finetune_dissect.py[:variant]`."""
from iclr24_jax.configs.finetune_dissect import *  # noqa: F401,F403
from iclr24_jax.configs.finetune_dissect import get_config  # noqa: F401
