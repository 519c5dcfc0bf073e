"""Launcher path for `iclr24_jax/configs/llmbar.py` (the packaged config): `--config=configs/llmbar.py[:variant]`."""
from iclr24_jax.configs.llmbar import *  # noqa: F401,F403
from iclr24_jax.configs.llmbar import get_config  # noqa: F401
