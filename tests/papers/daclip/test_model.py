"""DA-CLIP's model (`papers/daclip/model.py`): the controller's zero-init identity and reversed control
order, the controller loss by hand and its train step, the restorer's shapes and errors."""
import math

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers import daclip
from iclr24_jax.vision import clip


def _tiny_clip():
  cfg = ml_collections.ConfigDict(dict(embed_dim=8, image=dict(name="vit", patch_size=4, width=16, depth=3, heads=2),
                                       text=dict(name="transformer", max_len=6, width=16, depth=1, heads=2)))
  model = clip.create_clip(cfg, 12)
  params = model.init(jax.random.key(0), jnp.zeros((2, 8, 8, 1)), jnp.ones((2, 6), jnp.int32))["params"]
  return model, params


def test_zero_init_controller_gives_the_frozen_encoder_output():
  clip_model, clip_params = _tiny_clip()
  model = daclip.daclip_from_clip(clip_model)
  params = daclip.init_daclip_params(model, clip_params, (8, 8, 1))
  x = jnp.asarray(np.random.default_rng(0).random((3, 8, 8, 1)), jnp.float32)
  e_c, e_d = jax.jit(model.apply)({"params": params}, x)
  chex.assert_shape([e_c, e_d], (3, 8))
  frozen = jax.jit(lambda p, x: clip_model.apply({"params": p}, x, method=clip.CLIP.encode_image,
                                                 normalize=False))(clip_params, x)
  np.testing.assert_allclose(np.asarray(e_c), np.asarray(frozen), rtol=1e-6, atol=1e-7)   # zero controls
  np.testing.assert_allclose(np.asarray(e_d), np.asarray(frozen), rtol=1e-6, atol=1e-7)   # an exact copy at init
  # Non-zero projections change e_c; only the controller side gets gradients (the encoder is frozen).
  batch = {"image": x, "caption_emb": clip.l2_normalize(jnp.eye(3, 8)),
           "degradation_emb": clip.l2_normalize(jnp.eye(3, 8)[::-1])}
  grads = jax.jit(jax.grad(lambda p: daclip.controller_loss(p, model, batch)[0]))(params)
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(grads["encoder"]))
  assert float(jnp.abs(grads["control_proj_0"]["kernel"]).max()) > 0
  with pytest.raises(ValueError, match="ViT"):
    daclip.daclip_from_clip(clip.create_clip(ml_collections.ConfigDict(dict(
        embed_dim=8, image=dict(name="cnn", features=(4,), dense=8), text=dict(name="transformer"))), 12))


def test_controls_are_added_in_reversed_block_order():
  """The controller's block-i control goes after frozen block L-1-i (official `control.pop()`): with only the
  last projection non-zero, the frozen encoder's first block is the one that sees it."""
  clip_model, clip_params = _tiny_clip()
  model = daclip.daclip_from_clip(clip_model)
  params = daclip.init_daclip_params(model, clip_params, (8, 8, 1))
  params["control_proj_2"] = {"kernel": jnp.zeros((16, 16)), "bias": jnp.ones((16,))}    # control = +1 everywhere
  x = jnp.asarray(np.random.default_rng(0).random((2, 8, 8, 1)), jnp.float32)
  e_c, _ = model.apply({"params": params}, x)
  vit = clip_model.image_encoder
  ones = jnp.ones((2, 5, 16))
  want = vit.apply({"params": clip_params["image_encoder"]}, x, controls=[ones, 0 * ones, 0 * ones])
  np.testing.assert_allclose(np.asarray(e_c), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_controller_loss_by_hand_and_train_step_lowers_it():
  clip_model, clip_params = _tiny_clip()
  model = daclip.daclip_from_clip(clip_model)
  params = daclip.init_daclip_params(model, clip_params, (8, 8, 1))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.random((8, 8, 8, 1)), jnp.float32)
  cap = clip.l2_normalize(jnp.asarray(rng.normal(size=(8, 8)), jnp.float32))
  deg = clip.l2_normalize(jnp.asarray(rng.normal(size=(8, 8)), jnp.float32))
  batch = {"image": x, "caption_emb": cap, "degradation_emb": deg}
  loss, m = daclip.controller_loss(params, model, batch)
  e_c, e_d = model.apply({"params": params}, x)
  scale = math.exp(float(params["logit_scale"]))
  want = clip.clip_loss(clip.l2_normalize(e_c), cap, scale) + clip.clip_loss(clip.l2_normalize(e_d), deg, scale)
  np.testing.assert_allclose(float(loss), float(want), atol=1e-5)
  np.testing.assert_allclose(float(m["content_loss"] + m["degradation_loss"]), float(loss), atol=1e-5)
  opt = ml_collections.ConfigDict(dict(learning_rate=3e-3, schedule="constant", weight_decay=0.0))
  state = TrainState.create(params, daclip.make_controller_optimizer(opt, 20, params))
  step = jax.jit(chex.assert_max_traces(daclip.make_controller_train_step(model), n=1))
  losses = []
  for _ in range(6):
    state, metrics = step(state, batch, jax.random.key(0))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0]
  chex.assert_trees_all_equal(state.params["encoder"], params["encoder"])        # frozen: bit-identical
  with pytest.raises(KeyError, match="degradation_emb"):
    daclip.controller_loss(params, model, {"image": x, "caption_emb": cap})


def test_restore_shapes_and_errors(sde):
  net = daclip.create_restorer(ml_collections.ConfigDict(dict(base_channels=8, channel_mults=(1,),
                                                              num_res_blocks=1, attention_levels=(0,), num_heads=2,
                                                              out_channels=1, num_groups=4)))
  x = jnp.zeros((2, 8, 8, 1))
  e = jnp.zeros((2, 8))
  params = net.init(jax.random.key(0), jnp.zeros((2, 8, 8, 2)), jnp.ones((2,)), cond=e, context=e[:, None])["params"]
  small = daclip.irsde_schedule(T=3)
  out = jax.jit(lambda k, p, lq, c, d: daclip.restore(k, p, lq, model=net, schedule=small, e_c=c, e_d=d))(
      jax.random.key(0), params, x + 0.5, e, e)
  chex.assert_shape(out, (2, 8, 8, 1))
  assert np.isfinite(np.asarray(out)).all()
  with pytest.raises(ValueError, match="e_c must be"):
    daclip.restore(jax.random.key(0), params, x, model=net, schedule=small, e_c=jnp.zeros((3, 8)), e_d=e)
  with pytest.raises(ValueError, match="method"):
    daclip.restore(jax.random.key(0), params, x, model=net, schedule=small, method="ode")
