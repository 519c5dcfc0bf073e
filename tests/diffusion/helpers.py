"""Shared by the diffusion family's test modules: a tiny UNet's settings, random non-zero params, the fast
compile, every kind of conditioning for a batch."""
import jax
import jax.flatten_util
import jax.numpy as jnp

from iclr24_jax.common import loop as loop_lib


# Two levels; attention (self + cross) only in the middle block keeps the CPU compile short.
TINY_UNET = dict(base_channels=8, channel_mults=(1, 2), num_res_blocks=1, attention_levels=(), num_heads=2,
                 num_groups=4)


def _perturb(params, key, scale=0.1):
  """Random non-zero params (the zero-initialised output layers would hide context and skip paths).

  One normal draw for the whole flattened tree: a draw per leaf would cost a random-number kernel compile each.
  """
  flat, unravel = jax.flatten_util.ravel_pytree(params)
  return unravel(flat + scale * jax.random.normal(key, flat.shape))


_fast_jit = loop_lib.compile_fast   # one-shot programs: compile time dominates them on CPU


def _cond_batch(b):
  """Every kind of conditioning for a batch of b: class labels, a vector, context tokens with a mask."""
  return dict(class_labels=jnp.arange(b) % 11, cond=jnp.ones((b, 5)), context=jnp.ones((b, 4, 6)),
              context_mask=jnp.tile(jnp.array([[1, 1, 0, 0]], bool), (b, 1)))
