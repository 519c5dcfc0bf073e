"""The training loss and step (`diffusion/train.py`): the loss by hand, min-SNR weights across
parameterisations, exact condition dropout, 1 vs 8 devices, errors."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import sharding
from iclr24_jax.diffusion import process, schedules, train, unet
from .helpers import _fast_jit


def test_loss_hand_computed():
  # A two-step schedule with alpha_bar = (0.75, 0.25); t = 1: alpha = 0.5, sigma = sqrt(0.75) = 0.8660254.
  sched = schedules.from_alpha_bars([0.75, 0.25])
  x0 = jnp.array([[1.0, -1.0]])
  noise = jnp.array([[0.5, -0.5]])
  t = jnp.array([1])
  zero = lambda x_t, t: jnp.zeros_like(x_t)  # noqa: E731
  loss = lambda **kw: train.diffusion_loss(zero, x0, jax.random.key(0), sched, t=t, noise=noise, **kw)[0]  # noqa
  # eps target: mean(0.5^2, 0.5^2) = 0.25; x0 target: mean(1, 1) = 1.
  np.testing.assert_allclose(loss(prediction="eps"), 0.25, atol=1e-6)
  np.testing.assert_allclose(loss(prediction="x0"), 1.0, atol=1e-6)
  # v = alpha eps - sigma x0 = 0.25 - 0.8660254 = -0.6160254 (and +0.6160254): loss = 0.3794873.
  np.testing.assert_allclose(loss(prediction="v"), 0.3794873, atol=1e-6)
  # min-SNR: SNR = 0.25 / 0.75 = 1/3; gamma = 5 -> eps weight min(1/3, 5) / (1/3) = 1 -> 0.25;
  # gamma = 0.1 -> 0.1 / (1/3) = 0.3 -> 0.075; x0 weight min(1/3, 0.1) = 0.1 -> 0.1; v weight 0.1 / (4/3) = 0.075.
  np.testing.assert_allclose(loss(prediction="eps", weighting="min_snr"), 0.25, atol=1e-6)
  np.testing.assert_allclose(loss(prediction="eps", weighting="min_snr", min_snr_gamma=0.1), 0.075, atol=1e-6)
  np.testing.assert_allclose(loss(prediction="x0", weighting="min_snr", min_snr_gamma=0.1), 0.1, atol=1e-6)
  np.testing.assert_allclose(loss(prediction="v", weighting="min_snr", min_snr_gamma=0.1), 0.3794873 * 0.075,
                             atol=1e-6)


def test_min_snr_losses_agree_across_parameterisations():
  # One x0 estimate expressed as eps, x0 and v gives the same min-SNR-weighted loss (Hang et al. 2023, Sec. 3.4).
  sched = schedules.cosine_beta_schedule(1000)
  rng = np.random.default_rng(0)
  x0 = rng.standard_normal((16, 4, 4, 1)).astype(np.float32)
  x0_hat = x0 + 0.3 * rng.standard_normal(x0.shape).astype(np.float32)
  t = rng.integers(0, 1000, 16).astype(np.int32)
  noise = rng.standard_normal(x0.shape).astype(np.float32)

  @jax.jit
  def losses(x0, x0_hat, t, noise):
    per = {}
    for pred in ("eps", "x0", "v"):
      fn = lambda x, tt, pred=pred: process.convert(x, x0_hat, sched.alpha_bar(tt), "x0", pred)  # noqa: E731
      per[pred] = train.diffusion_loss(fn, x0, jax.random.key(5), sched, prediction=pred, weighting="min_snr",
                                          t=t, noise=noise)[1]["per_example"]
    return per

  per = losses(x0, x0_hat, t, noise)
  np.testing.assert_allclose(per["eps"], per["x0"], rtol=2e-3, atol=1e-6)
  np.testing.assert_allclose(per["v"], per["x0"], rtol=2e-3, atol=1e-6)


def test_condition_dropout_exact(mlp_setup):
  model, st, batch = mlp_setup
  sched = schedules.linear_beta_schedule(100)
  key = jax.random.key(1)
  # cond_drop_prob = 1 trains exactly the unconditional model: null label (num_classes = 3) and a zero condition.
  a, _ = _fast_jit(train.make_train_step(model, sched, cond_drop_prob=1.0), st, batch, key)(st, batch, key)
  null_batch = {**batch, "y": np.full((16,), 3, np.int32), "cond": np.zeros_like(batch["cond"])}
  b, _ = _fast_jit(train.make_train_step(model, sched), st, null_batch, key)(st, null_batch, key)
  chex.assert_trees_all_close(a.params, b.params, rtol=1e-6, atol=1e-7)


def test_train_step_same_on_1_and_8_devices(mlp_setup):
  model, st0, batch = mlp_setup
  sched = schedules.ContinuousSchedule("cosine")
  step = train.make_train_step(model, sched, prediction="v", weighting="min_snr")
  outs = []
  for mesh in sharding.device_meshes((1, 8)):
    with jax.set_mesh(mesh):
      st = sharding.replicate(st0, mesh)
      fn = loop_lib.compile_step(step, mesh, donate=False)  # st0 is reused for the second mesh
      for _ in range(3):
        st, m = fn(st, sharding.shard_batch(batch, mesh), jax.random.key(3))
      outs.append((jax.device_get(st.params), float(m["loss"])))
  chex.assert_trees_all_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-5)


def test_training_errors():
  sched = schedules.linear_beta_schedule(10)
  with pytest.raises(ValueError, match="floating"):
    train.diffusion_loss(lambda x, t: x, jnp.ones((2, 3), jnp.int32), jax.random.key(0), sched)
  with pytest.raises(ValueError, match="returned shape"):
    train.diffusion_loss(lambda x, t: x[:, :1], jnp.ones((2, 3)), jax.random.key(0), sched)
  with pytest.raises(ValueError, match="weighting"):
    train.loss_weight(jnp.ones(2), "eps", "p2")
  with pytest.raises(ValueError, match="cond_name"):
    train.make_denoiser(unet.MLPDenoiser(), {}, cond_name="label")
