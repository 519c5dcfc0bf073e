"""MDM's joint loss and train step (`papers/mdm/train.py`): the loss against hand arithmetic, v to eps
predictions, the train step lowers the loss, the joint sampler's shapes."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers import mdm
from .helpers import _fast_jit, _perturb


def test_loss_matches_hand_computation(nested):
  """A fresh model predicts v = 0 (zero output convs), so eps_hat_r = sqrt(1 - abar_r) x_t^r and
  L = sum_r mean (sqrt(1 - abar_r) x_t^r - eps_r)^2, with abar_r from level r's shifted schedule at the shared t."""
  model, scheds, params = nested
  rng = np.random.default_rng(1)
  x = rng.uniform(-1, 1, (4, 16, 16, 1)).astype(np.float32)
  y = np.array([1, 2, 3, 4], np.int32)
  t = np.array([3, 30, 60, 97], np.int32)
  noise = [rng.standard_normal((4, 16, 16, 1)).astype(np.float32), rng.standard_normal((4, 8, 8, 1)).astype(np.float32)]
  def loss_of(p, **kw):
    return mdm.loss_fn(p, {"x": x, "y": y}, jax.random.key(0), model=model, schedules=scheds, t=t, noise=noise,
                       train=False, **kw)

  loss, aux = _fast_jit(loss_of, params)(params)
  x8 = x.reshape(4, 8, 2, 8, 2, 1).mean(axis=(2, 4))
  want = []
  for r, (x0, n) in enumerate(zip([x, x8], noise)):
    a = np.asarray(scheds[r].alpha_bars, np.float64)[t].reshape(-1, 1, 1, 1)
    xt = np.sqrt(a) * x0 + np.sqrt(1 - a) * n
    want.append(np.mean((np.sqrt(1 - a) * xt - n) ** 2))
  np.testing.assert_allclose(aux["mse"], want, rtol=1e-5)
  np.testing.assert_allclose(loss, sum(want), rtol=1e-5)
  # Mixed ratio (1/2, 1): the high resolution counts only the first half of the batch.
  mixed = lambda p: loss_of(p, mixed_ratio=(0.5, 1.0), level_weights=(2.0, 1.0))  # noqa: E731
  loss_m, aux_m = _fast_jit(mixed, params)(params)
  a0 = np.asarray(scheds[0].alpha_bars, np.float64)[t[:2]].reshape(-1, 1, 1, 1)
  xt0 = np.sqrt(a0) * x[:2] + np.sqrt(1 - a0) * noise[0][:2]
  want0 = np.mean((np.sqrt(1 - a0) * xt0 - noise[0][:2]) ** 2)
  np.testing.assert_allclose(aux_m["mse"], [want0, want[1]], rtol=1e-5)
  np.testing.assert_allclose(loss_m, 2.0 * want0 + want[1], rtol=1e-5)
  with pytest.raises(ValueError, match="2 levels but 1 schedules"):
    mdm.loss_fn(params, {"x": x, "y": y}, jax.random.key(0), model=model, schedules=scheds[:1])
  with pytest.raises(ValueError, match="mixed_ratio"):
    mdm.loss_fn(params, {"x": x, "y": y}, jax.random.key(0), model=model, schedules=scheds, mixed_ratio=(1.0, 0.5))


def test_loss_converts_nonzero_v_predictions_to_eps(nested):
  """With perturbed (non-zero-output) params the loss must turn each level's v prediction into eps (the official
  run: v-prediction, loss_target DDPM): x_t = sqrt(a) x0 + sqrt(1 - a) n, eps_hat = sqrt(1 - a) x_t + sqrt(a) v_hat,
  L = sum_r mean (eps_hat_r - n_r)^2. v_hat comes from the model applied to the numpy x_t; the conversion and the
  loss are recomputed in float64."""
  model, scheds, params = nested
  p = _perturb(params, jax.random.key(7), scale=0.05)
  rng = np.random.default_rng(2)
  x = rng.uniform(-1, 1, (4, 16, 16, 1)).astype(np.float32)
  y = np.array([0, 5, 9, 3], np.int32)
  t = np.array([2, 25, 70, 99], np.int32)
  noise = [rng.standard_normal((4, 16, 16, 1)).astype(np.float32), rng.standard_normal((4, 8, 8, 1)).astype(np.float32)]
  x0s = [x.astype(np.float64), x.reshape(4, 8, 2, 8, 2, 1).mean(axis=(2, 4)).astype(np.float64)]
  abar = [np.asarray(sc.alpha_bars, np.float64)[t].reshape(-1, 1, 1, 1) for sc in scheds]
  xts = [np.sqrt(a) * x0 + np.sqrt(1 - a) * n for x0, a, n in zip(x0s, abar, noise)]

  def both(p):
    loss = mdm.loss_fn(p, {"x": x, "y": y}, jax.random.key(0), model=model, schedules=scheds, t=t, noise=noise,
                       train=False)
    v = model.apply({"params": p}, [jnp.asarray(xt, jnp.float32) for xt in xts], t, class_labels=y)
    return loss, v

  (loss, aux), v = _fast_jit(both, p)(p)
  v = [np.asarray(vr, np.float64) for vr in v]
  assert min(float(np.abs(vr).mean()) for vr in v) > 1e-2             # the v branch is really exercised
  eps_hat = [np.sqrt(1 - a) * xt + np.sqrt(a) * vr for a, xt, vr in zip(abar, xts, v)]
  want = [np.mean((e - n) ** 2) for e, n in zip(eps_hat, noise)]
  # the v-to-eps conversion matters: reading v_hat as eps_hat would give a different loss
  assert abs(np.mean((v[0] - noise[0]) ** 2) - want[0]) > 1e-2
  np.testing.assert_allclose(aux["mse"], want, rtol=1e-4)
  np.testing.assert_allclose(loss, sum(want), rtol=1e-4)


def test_train_step_lowers_the_loss_and_sampler_shapes(nested):
  model, scheds, params = nested
  rng = np.random.default_rng(2)
  batch = {"x": jnp.asarray(rng.uniform(-1, 1, (8, 16, 16, 1)), jnp.float32), "y": jnp.arange(8) % 10}
  step = chex.assert_max_traces(mdm.make_train_step(model, scheds, cond_drop_prob=0.1), n=1)
  state = TrainState.create(params, optax.adam(3e-3))

  def eval_loss(p):   # fixed t and noise: the same objective before and after
    return mdm.loss_fn(p, batch, jax.random.key(5), model=model, schedules=scheds, train=False)[0]

  def run(state, key):
    def body(st, i):
      return step(st, batch, jax.random.fold_in(key, i))
    return jax.lax.scan(body, state, jnp.arange(25))

  eval_c = _fast_jit(eval_loss, params)
  before = float(eval_c(params))
  state, metrics = _fast_jit(run, state, jax.random.key(1))(state, jax.random.key(1))
  after = float(eval_c(state.params))
  assert np.isfinite(np.asarray(metrics["loss"])).all()
  assert after < 0.8 * before, (before, after)
  # The joint sampler: every level, guided, in [-1, 1]; cross-level consistency per example.
  labels = jnp.array([0, 3, 9])
  smp = lambda p, k: mdm.sample(k, p, model=model, schedules=scheds, image_shape=(16, 16, 1), labels=labels,  # noqa
                                guidance_scale=2.0, num_steps=3)
  out = _fast_jit(smp, state.params, jax.random.key(0))(state.params, jax.random.key(0))
  chex.assert_shape(out, [(3, 16, 16, 1), (3, 8, 8, 1)])
  assert all(float(jnp.max(jnp.abs(o))) <= 1.0 for o in out)
  chex.assert_shape(mdm.consistency(out, model), (3,))
  with pytest.raises(ValueError, match="labels"):
    mdm.sample(jax.random.key(0), params, model=model, schedules=scheds, image_shape=(16, 16, 1))
