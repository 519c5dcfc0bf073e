"""iclr24_jax: ICLR 2024 methods as pure, composable JAX/Flax functions.

Layers (each imports only the layers below it):
  papers/<slug>  ->  vision, diffusion, lm, rl  ->  common
"""

__version__ = "0.1.0"

__all__ = ["checked"]


def __getattr__(name):
  # `checked` (common/checks.py) is loaded on first use, so `import iclr24_jax` stays free of JAX: launchers and
  # tests configure JAX (device counts, distributed init) after importing the package.
  if name == "checked":
    from iclr24_jax.common.checks import checked
    return checked
  raise AttributeError(f"module 'iclr24_jax' has no attribute {name!r}")
