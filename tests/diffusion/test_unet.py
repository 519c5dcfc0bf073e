"""The denoisers (`diffusion/unet.py`): the timestep embedding by hand, the UNet's shapes and every kind
of conditioning, the MLP denoiser, errors, a nesting hook contributing zeros; the fully conditioned
UNet's train step lowers a fixed batch's loss (here, beside the other user of its ~6 s fixture)."""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.diffusion import schedules, train, unet
from .helpers import TINY_UNET, _perturb, _fast_jit, _cond_batch


class _Inner(nn.Module):
  """A stand-in for a nested (inner, lower-resolution) UNet at the bottleneck."""

  @nn.compact
  def __call__(self, h, temb, inner_inputs=None, **unused):
    return h + nn.Dense(h.shape[-1], name="inner_proj")(nn.silu(temb))[:, None, None, :]


class _LowResInner(nn.Module):
  """A nesting hook in MDM's shape: reads a low-resolution image from inner_inputs, feeds the bottleneck features
  to it through a conv, adds its features back through a zero-initialised conv, and returns a low-res prediction."""

  @nn.compact
  def __call__(self, h, temb, inner_inputs, *, t, class_labels=None, **unused):
    low = inner_inputs["x_low"]                                            # [B, h, w, 1]
    f = nn.Conv(h.shape[-1], (3, 3), name="in_adapter")(h) + nn.Conv(h.shape[-1], (3, 3), name="stem")(low)
    f = nn.silu(f + nn.Dense(h.shape[-1], name="t_proj")(temb)[:, None, None, :])
    pred_low = nn.Conv(low.shape[-1], (3, 3), name="out")(f)
    back = nn.Conv(h.shape[-1], (3, 3), kernel_init=nn.initializers.zeros, bias_init=nn.initializers.zeros,
                   name="out_adapter")(f)
    return h + back, pred_low


@pytest.fixture(scope="module")
def cond_unet():
  """A tiny fully-conditioned UNet (class labels, vector cond, cross-attention, a nested inner module), its state,
  perturbed params and a compiled forward fwd(params, x, t, kw) -> (out, top-level features)."""
  model = unet.UNet(num_classes=10, out_channels=1, inner=_Inner(), **TINY_UNET)
  init = _fast_jit(lambda k: train.init(k, model, (8, 8, 1), optax.adam(3e-3), ema=True,
                                                 **_cond_batch(1)), jax.random.key(0))
  state = init(jax.random.key(0))
  kw = {**_cond_batch(2), "inject": jnp.zeros((2, 8, 8, 8))}
  fwd = _fast_jit(lambda p, x, t, kw: model.apply({"params": p}, x, t, return_features=True, **kw), state.params,
                  jnp.ones((2, 8, 8, 1)), jnp.zeros(2, jnp.int32), kw)
  return model, state, _perturb(state.params, jax.random.key(1)), fwd


def test_timestep_embedding_values():
  # dim 4: half = 2, frequencies 10000^(-0/2) = 1 and 10000^(-1/2) = 0.01; emb = [cos t, cos 0.01t, sin t, sin 0.01t].
  emb = unet.timestep_embedding(jnp.array([0.0, 1.0]), 4)
  np.testing.assert_allclose(emb, [[1, 1, 0, 0], [np.cos(1), np.cos(0.01), np.sin(1), np.sin(0.01)]], rtol=1e-6,
                             atol=1e-7)


def test_unet_shapes_and_conditioning(cond_unet):
  model, state, p, fwd_with_features = cond_unet
  params = state.params
  assert "class_embed" in params and "cond_embed_0" in params
  assert "cross_attn" in params["mid_attn"]
  x = jnp.ones((2, 8, 8, 1))
  kw = {**_cond_batch(2), "inject": jnp.zeros((2, 8, 8, 8))}
  t = jnp.array([0, 999])
  out, feats = fwd_with_features(params, x, t, kw)
  chex.assert_shape(out, (2, 8, 8, 1))
  chex.assert_shape(feats, (2, 8, 8, 8))
  chex.assert_type(out, jnp.float32)
  # Zero-initialised output conv: a fresh UNet predicts 0.
  np.testing.assert_allclose(out, 0.0, atol=0)

  def fwd(*args):
    return fwd_with_features(*args)[0]

  base = fwd(p, x, t, kw)
  # Masked-out context tokens (2 and 3) do not matter; unmasked ones do.
  ctx = kw["context"].at[0, 2:].set(-5.0)
  np.testing.assert_allclose(fwd(p, x, t, {**kw, "context": ctx})[0], base[0], rtol=1e-5, atol=1e-5)
  ctx = kw["context"].at[0, 0].set(-5.0)
  assert float(jnp.max(jnp.abs(fwd(p, x, t, {**kw, "context": ctx})[0] - base[0]))) > 1e-3
  # Class label, vector condition and time change the output.
  for changed in ({**kw, "class_labels": jnp.array([4, 10])}, {**kw, "cond": -kw["cond"]}):
    assert float(jnp.max(jnp.abs(fwd(p, x, t, changed)[0] - base[0]))) > 1e-3
  assert float(jnp.max(jnp.abs(fwd(p, x, jnp.array([500, 999]), kw)[0] - base[0]))) > 1e-3
  # Nesting hooks: the inner module has params and runs; injected stem features change the output.
  assert "inner_proj" in params["inner"]
  assert float(jnp.max(jnp.abs(fwd(p, x, t, {**kw, "inject": jnp.ones((2, 8, 8, 8))}) - base))) > 1e-3
  # The bigger layout (attention at a level, two res blocks, scale-shift) builds and keeps the shape.
  big = unet.UNet(base_channels=8, channel_mults=(1, 2, 2), num_res_blocks=2, attention_levels=(1,), num_heads=2,
                  num_groups=4, scale_shift=True, out_channels=3)
  shapes = jax.eval_shape(lambda k: big.init_with_output(k, jnp.ones((2, 16, 16, 1)), jnp.zeros(2),
                                                         context=jnp.ones((2, 3, 6)))[0], jax.random.key(0))
  chex.assert_shape(shapes, (2, 16, 16, 3))


def test_mlp_denoiser_shapes(mlp_setup):
  model, st, batch = mlp_setup
  p = _perturb(st.params, jax.random.key(1))
  fwd = _fast_jit(lambda p, x, t, c, y: model.apply({"params": p}, x, t, cond=c, class_labels=y), p, batch["x"],
                  jnp.arange(16), batch["cond"], batch["y"])
  out = fwd(p, batch["x"], jnp.arange(16), batch["cond"], batch["y"])
  chex.assert_shape(out, (16, 2, 3))  # [B, 2, 3] in, flattened inside, [B, 2, 3] out
  assert float(jnp.max(jnp.abs(out - fwd(p, batch["x"], jnp.arange(16), -batch["cond"], batch["y"])))) > 1e-3


def test_model_errors():
  m = unet.UNet(**TINY_UNET)
  with pytest.raises(ValueError, match=r"\[B, H, W, C\]"):
    m.init(jax.random.key(0), jnp.ones((2, 8, 8)), jnp.zeros(2))
  with pytest.raises(ValueError, match="divisible by 2"):
    m.init(jax.random.key(0), jnp.ones((2, 7, 7, 1)), jnp.zeros(2))
  with pytest.raises(ValueError, match="class_labels"):
    unet.UNet(num_classes=3, **TINY_UNET).init(jax.random.key(0), jnp.ones((2, 8, 8, 1)), jnp.zeros(2))
  with pytest.raises(ValueError, match="attention_levels"):
    unet.UNet(**{**TINY_UNET, "attention_levels": (5,)}).init(jax.random.key(0), jnp.ones((2, 8, 8, 1)), jnp.zeros(2))
  with pytest.raises(ValueError, match="context"):
    unet.MLPDenoiser().init(jax.random.key(0), jnp.ones((2, 3)), jnp.zeros(2), context=jnp.ones((2, 1, 3)))
  with pytest.raises(ValueError, match="unknown unet model options"):
    unet.create_model({"name": "unet", "channels": 3})
  with pytest.raises(ValueError, match="unknown diffusion model"):
    unet.create_model({"name": "dit"})


def test_unet_train_step_lowers_fixed_batch_loss(cond_unet):
  model, state, _, _ = cond_unet
  rng = np.random.default_rng(0)
  batch = {"x": jnp.asarray(rng.uniform(-1, 1, (16, 8, 8, 1)), jnp.float32), **_cond_batch(16)}
  batch["y"] = batch.pop("class_labels") % 10
  sched = schedules.linear_beta_schedule(1000)
  step = chex.assert_max_traces(train.make_train_step(model, sched, cond_drop_prob=0.1, ema_decay=0.9), n=1)
  step = _fast_jit(step, state, batch, jax.random.key(1))
  kw = train.model_kwargs(batch)

  def fixed_loss_fn(params):  # the same t and eps every time
    fn = lambda x, t: model.apply({"params": params}, x, t, **kw)  # noqa: E731
    return train.diffusion_loss(fn, batch["x"], jax.random.key(42), sched)[0]

  fixed_loss = _fast_jit(fixed_loss_fn, state.params)

  before = float(fixed_loss(state.params))
  new, _ = step(state, batch, jax.random.key(1))
  # EMA after one update: 0.9 * init + 0.1 * new params.
  chex.assert_trees_all_close(new.extra["ema_params"],
                              jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, state.params, new.params),
                              rtol=1e-5, atol=1e-7)
  for _ in range(24):
    new, metrics = step(new, batch, jax.random.key(1))
  after = float(fixed_loss(new.params))
  assert np.isfinite(float(metrics["loss"])) and int(new.step) == 25
  assert after < 0.9 * before, (before, after)


def test_unet_inner_contributing_zeros_reproduces_the_plain_unet():
  """Nesting hook (mdm nests UNets): an inner network whose contribution is zero leaves the outer UNet exactly the plain
  UNet with the same params, hands back its low-resolution prediction, and changes the output once it is not 0."""
  cfg = dict(TINY_UNET, num_classes=10, scale_shift=True)
  plain = unet.UNet(**cfg)
  nested = unet.UNet(inner=_LowResInner(), **cfg)
  b = 3
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((b, 8, 8, 1)), jnp.float32)
  low = {"x_low": jnp.asarray(rng.standard_normal((b, 4, 4, 1)), jnp.float32)}
  t, y = jnp.array([3, 50, 900]), jnp.array([0, 4, 10])
  params = _fast_jit(lambda k: nested.init(k, x, t, class_labels=y, inner_inputs=low)["params"],
                     jax.random.key(0))(jax.random.key(0))
  assert set(params) - {"inner"} == set(jax.eval_shape(
      lambda k: plain.init(k, x, t, class_labels=y), jax.random.key(0))["params"])
  p = _perturb({k: v for k, v in params.items() if k != "inner"}, jax.random.key(1))   # non-zero outer
  p_inner = dict(params["inner"])
  fwd_nested = _fast_jit(lambda pp, pi: nested.apply({"params": {**pp, "inner": pi}}, x, t, class_labels=y,
                                                     inner_inputs=low), p, p_inner)
  fwd_plain = _fast_jit(lambda pp: plain.apply({"params": pp}, x, t, class_labels=y), p)
  out, pred_low = fwd_nested(p, p_inner)
  ref = fwd_plain(p)
  chex.assert_shape(pred_low, (b, 4, 4, 1))
  assert float(jnp.max(jnp.abs(ref))) > 1e-2            # the comparison is not between two zero outputs
  np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
  # A non-zero out-adapter makes the inner network count.
  p_inner["out_adapter"] = jax.tree.map(lambda a: a + 0.1, p_inner["out_adapter"])
  out2, _ = fwd_nested(p, p_inner)
  assert float(jnp.max(jnp.abs(out2 - ref))) > 1e-3
  # mid_blocks=False drops the middle blocks (MDM's outer UNet); inner_inputs without an inner is an error.
  no_mid = jax.eval_shape(lambda k: unet.UNet(mid_blocks=False, **cfg).init(k, x, t, class_labels=y),
                          jax.random.key(0))["params"]
  assert not any(k.startswith("mid_") for k in no_mid)
  with pytest.raises(ValueError, match="no inner module"):
    jax.eval_shape(lambda k: plain.init(k, x, t, class_labels=y, inner_inputs=low), jax.random.key(0))
