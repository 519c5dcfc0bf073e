"""MDM's NestedUNet (`papers/mdm/model.py`): shifted schedules, the pyramid, the zero-adapter
invariants, progressive loading's tree check, three levels nested recursively."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.diffusion import schedules
from iclr24_jax.diffusion.unet import UNet
from iclr24_jax.papers import mdm
from .helpers import OUTER, INNER, _fast_jit, _perturb


def test_shifted_log_snr_and_level_schedules():
  lam = jnp.array([-3.0, 0.0, 2.5])
  for p in (1.0, 2.0):
    for s in (2, 4, 8):
      # log SNR_r - log SNR = -p log s_r  (SNR_r = SNR / s^p)
      np.testing.assert_allclose(mdm.shifted_log_snr(lam, s, p) - lam, -p * math.log(s), rtol=1e-6)
  # power 2 is simple diffusion's resolution shift 2 log(low / high).
  np.testing.assert_allclose(mdm.shifted_log_snr(lam, 32 / 8, 2.0), lam + schedules.resolution_shift(8, 32),
                             rtol=1e-6)
  base = schedules.squaredcos_cap_v2(1000)
  hi, mid, lo = mdm.level_schedules(base, 3, 2, power=1.0)                 # ratios 4, 2, 1
  np.testing.assert_allclose(lo.alpha_bars, base.alpha_bars)
  t = np.arange(5, 995, 97)   # away from the capped ends, where float32 alpha_bar loses digits
  np.testing.assert_allclose(np.asarray(hi.log_snrs)[t] - np.asarray(base.log_snrs)[t], -math.log(4), atol=2e-4)
  np.testing.assert_allclose(np.asarray(mid.log_snrs)[t] - np.asarray(base.log_snrs)[t], -math.log(2), atol=2e-4)
  assert mdm.level_ratios(3, 4) == (16, 4, 1)
  with pytest.raises(ValueError, match="positive"):
    mdm.shifted_log_snr(lam, 0.0)


def test_pyramid_shapes_and_values():
  x = jnp.arange(2 * 8 * 8 * 1, dtype=jnp.float32).reshape(2, 8, 8, 1)
  levels = mdm.pyramid(x, 3, 2)
  chex.assert_shape(levels, [(2, 8, 8, 1), (2, 4, 4, 1), (2, 2, 2, 1)])
  # Top-left 2x2 block of image 0: values 0, 1, 8, 9 -> mean 4.5; level 2 top-left 4x4 block: rows 0..3, cols
  # 0..3 -> mean of (8 r + c) = 8 * 1.5 + 1.5 = 13.5.
  assert float(levels[1][0, 0, 0, 0]) == 4.5
  assert float(levels[2][0, 0, 0, 0]) == 13.5
  chex.assert_shape(mdm.pyramid(jnp.zeros((1, 32, 32, 3)), 2, 4), [(1, 32, 32, 3), (1, 8, 8, 3)])
  with pytest.raises(ValueError, match="divisible"):
    mdm.pyramid(jnp.zeros((1, 28, 28, 1)), 3, 4)   # 28 is not divisible by 4^2
  with pytest.raises(ValueError, match="B, H, W, C"):
    mdm.pyramid(jnp.zeros((28, 28)), 2, 2)


def test_zero_adapters_low_res_equals_standalone_inner(nested):
  """At initialisation the adapters are zero: the nested model's low-resolution output is exactly the standalone
  inner UNet's (with the loaded params), and its high-resolution output is exactly the outer UNet's alone."""
  model, _, params = nested
  inner = mdm.inner_model(model)
  inner_params = _perturb(params["inner"], jax.random.key(1))              # a "trained" low-resolution model
  p = mdm.load_inner(_perturb(params, jax.random.key(2)), inner_params)    # non-zero outer; adapters perturbed too
  p["adapter"] = jax.tree.map(jnp.zeros_like, p["adapter"])                # ... and re-zeroed (as at init)
  rng = np.random.default_rng(0)
  x16 = jnp.asarray(rng.standard_normal((3, 16, 16, 1)), jnp.float32)
  x8 = jnp.asarray(rng.standard_normal((3, 8, 8, 1)), jnp.float32)
  t, y = jnp.array([1, 40, 99]), jnp.array([0, 7, 10])
  fn = _fast_jit(lambda p: (model.apply({"params": p}, [x16, x8], t, class_labels=y),
                            inner.apply({"params": p["inner"]}, x8, t, class_labels=y),
                            UNet(mid_blocks=False, num_classes=10, **OUTER).apply({"params": p["outer_unet"]}, x16,
                                                                                   t, class_labels=y)), p)
  (hi, lo), lo_ref, hi_ref = fn(p)
  chex.assert_shape([hi, lo], [(3, 16, 16, 1), (3, 8, 8, 1)])
  assert float(jnp.max(jnp.abs(lo_ref))) > 1e-2 and float(jnp.max(jnp.abs(hi_ref))) > 1e-2
  np.testing.assert_array_equal(lo, lo_ref)
  np.testing.assert_allclose(hi, hi_ref, rtol=1e-6, atol=1e-6)
  # Non-zero adapters couple the two resolutions.
  p2 = dict(p, adapter=_perturb(p["adapter"], jax.random.key(3)))
  (hi2, lo2), _, _ = fn(p2)
  assert float(jnp.max(jnp.abs(lo2 - lo_ref))) > 1e-3 and float(jnp.max(jnp.abs(hi2 - hi_ref))) > 1e-3


def test_load_inner_checks_the_tree(nested):
  model, _, params = nested
  with pytest.raises(ValueError, match="do not match"):
    mdm.load_inner(params, params["outer_unet"])
  with pytest.raises(ValueError, match="NestedUNet's params"):
    mdm.load_inner(params["inner"], params["inner"])


def test_three_levels_nest_recursively():
  """A NestedUNet inside a NestedUNet (32 -> 16 -> 8): three outputs, the inner-most params at inner/inner."""
  model = mdm.make_model([dict(OUTER), dict(OUTER), dict(INNER)], num_classes=0)
  assert mdm.num_levels(model) == 3 and mdm.level_factors(model) == (2, 2)
  xs = mdm.pyramid(jnp.zeros((2, 32, 32, 1)), 3, 2)
  out, variables = jax.eval_shape(lambda k: model.init_with_output(k, xs, jnp.zeros(2)), jax.random.key(0))
  chex.assert_shape(out, [(2, 32, 32, 1), (2, 16, 16, 1), (2, 8, 8, 1)])
  assert "outer_unet" in variables["params"]["inner"] and "time_embed" in variables["params"]["inner"]["inner"]
  with pytest.raises(ValueError, match="3 levels"):
    jax.eval_shape(lambda k: model.init(k, xs[:2], jnp.zeros(2)), jax.random.key(0))
  bad = mdm.make_model([dict(OUTER, channel_mults=(1, 2, 2)), dict(INNER)])   # outer reaches 4x4, not 8x8
  with pytest.raises(ValueError, match="channel_mults"):
    jax.eval_shape(lambda k: bad.init(k, mdm.pyramid(jnp.zeros((1, 16, 16, 1)), 2, 2), jnp.zeros(1)),
                   jax.random.key(0))
