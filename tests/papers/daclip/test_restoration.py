"""DA-CLIP's restoration stage (`papers/daclip/restoration.py`): stratified held-out draws and the
held-out loss as the matching loss."""
import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from iclr24_jax.papers import daclip


def test_heldout_draws_are_stratified_and_the_heldout_loss_is_the_matching_loss(sde):
  """Draw r of every image lies in the r-th of R equal strata of 1..T; the held-out loss of an image is the mean
  over its draws of `matching_loss_per_example` at x_t = m_t + sigma_bar_t z, whose batch mean is `matching_loss`."""
  from iclr24_jax.papers.daclip import restoration
  times, noise = restoration.heldout_draws(jax.random.key(0), 50, (4, 4, 1), 100, 10)
  chex.assert_shape(times, (50, 10))
  chex.assert_shape(noise, (50, 10, 4, 4, 1))
  lo = 1 + 10 * np.arange(10)                          # strata 1..10, 11..20, ..., 91..100
  assert (times >= lo).all() and (times <= lo + 9).all()
  assert len(np.unique(times[:, 0])) > 5               # uniform inside a stratum, not its left edge
  again = restoration.heldout_draws(jax.random.key(0), 50, (4, 4, 1), 100, 10)
  np.testing.assert_array_equal(again[0], times)
  with pytest.raises(ValueError, match="num_times"):
    restoration.heldout_draws(jax.random.key(0), 2, (4, 4, 1), 10, 11)

  net = daclip.create_restorer(ml_collections.ConfigDict(dict(base_channels=8, channel_mults=(1,),
                                                              num_res_blocks=1, attention_levels=(0,), num_heads=2,
                                                              out_channels=1, num_groups=4)))
  rng = np.random.default_rng(0)
  gt = jnp.asarray(rng.random((3, 4, 4, 1)), jnp.float32)
  lq = jnp.asarray(rng.random((3, 4, 4, 1)), jnp.float32)
  params = net.init(jax.random.key(1), jnp.zeros((3, 4, 4, 2)), jnp.ones((3,)))["params"]
  t2, z2 = times[:3, ::5], noise[:3, ::5]                                     # R = 2 draws per image
  got = np.asarray(daclip.heldout_matching_loss(params, net, {"gt": gt, "lq": lq}, jnp.asarray(t2),
                                                jnp.asarray(z2), sde))
  per_draw = []
  for r in range(2):
    t = jnp.asarray(t2[:, r])
    x_t = daclip.irsde_mean(gt, lq, t, sde) + daclip.irsde_std(t, sde)[:, None, None, None] * z2[:, r]
    pred = daclip.predict_noise(net, params, x_t, lq, t)
    per_ex = np.asarray(daclip.matching_loss_per_example(pred, x_t, gt, lq, t, sde))
    np.testing.assert_allclose(per_ex.mean(), float(daclip.matching_loss(pred, x_t, gt, lq, t, sde)), rtol=1e-6)
    per_draw.append(per_ex)
  np.testing.assert_allclose(got, np.mean(per_draw, axis=0), rtol=1e-5)
  with pytest.raises(ValueError, match="times must be"):
    daclip.heldout_matching_loss(params, net, {"gt": gt, "lq": lq}, jnp.asarray(t2[:2]), jnp.asarray(z2), sde)
