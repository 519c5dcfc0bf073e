"""Helpers shared by the PMP test modules."""
import jax

from iclr24_jax.papers import pmp


_init_params = jax.jit(pmp.init_params, static_argnums=(1, 2, 3))
