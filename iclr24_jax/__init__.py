"""iclr24_jax: ICLR 2024 methods as pure, composable JAX/Flax functions.

Layers (each imports only the layers below it):
  papers/<slug>  ->  vision, diffusion, lm, rl  ->  common
"""

__version__ = "0.1.0"
