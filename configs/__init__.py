"""Launcher paths: `--config=configs/<slug>.py[:variant]`. Each file re-exports `iclr24_jax.configs.<slug>`."""
