"""Helpers shared by the Safeguards test modules."""
import jax.numpy as jnp
import numpy as np


def _front_end(k, seed=0, bias=0.3):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.normal(size=k) * 1.5, jnp.float32), "b": jnp.float32(bias)}
