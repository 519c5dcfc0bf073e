"""Checkout-only shims of the launcher (`iclr24_jax.launch`): `python -m experiments.main | reproduce | benchmark`."""
