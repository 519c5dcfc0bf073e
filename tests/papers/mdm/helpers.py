"""Constants shared by the MDM test modules: tiny UNet levels, the fast compile, a parameter perturbation."""
import jax
import jax.flatten_util

from iclr24_jax.common import loop as loop_lib


BLOCK = dict(num_res_blocks=1, attention_levels=(), num_groups=4, scale_shift=True, mid_attention=False)
OUTER = dict(base_channels=4, channel_mults=(1, 2), **BLOCK)      # 16x16 -> bottleneck 8x8
INNER = dict(base_channels=8, channel_mults=(1, 2), **BLOCK)      # 8x8 -> 4x4


_fast_jit = loop_lib.compile_fast   # one-shot programs: compile time dominates them on CPU


def _perturb(params, key, scale=0.1):
  flat, unravel = jax.flatten_util.ravel_pytree(params)
  return unravel(flat + scale * jax.random.normal(key, flat.shape))
