"""Co-Boosting's algorithm (`papers/coboosting/coboost.py`): the ensemble-weight update by hand, ODS, hard-sample
synthesis, the distillation step (compiled once, 1 vs 8 devices)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import sharding
from iclr24_jax.papers import coboosting
from iclr24_jax.papers.coboosting import coboost
from .helpers import S


def test_update_weights_direction_hand_example():
  # Two clients, one sample of class 0. f1 = [2, 0] (right), f2 = [0, 2] (wrong), w = [0.5, 0.5]:
  # f_ens = (w1 f1 + w2 f2) / (w1 + w2) = [1, 1], p = [0.5, 0.5], dCE/df_ens = p - onehot = [-0.5, 0.5].
  # d f_ens / d w1 = (f1 - f_ens) / (w1 + w2) = [1, -1]  -> dCE/dw1 = -0.5 - 0.5 = -1 (raise w1);
  # d f_ens / d w2 = (f2 - f_ens) / (w1 + w2) = [-1, 1]  -> dCE/dw2 = +1 (lower w2).
  # Step 0.1: w = [0.6, 0.4]; the CE before the step is ln 2.
  cl = jnp.asarray([[[2.0, 0.0]], [[0.0, 2.0]]])
  w, loss = coboosting.update_weights(jnp.asarray([0.5, 0.5]), cl, jnp.asarray([0]), 0.1)
  np.testing.assert_allclose(w, [0.6, 0.4], rtol=1e-6)
  np.testing.assert_allclose(loss, np.log(2.0), atol=1e-4)
  # The better ensemble has a lower CE.
  _, loss_after = coboosting.update_weights(w, cl, jnp.asarray([0]), 0.1)
  assert float(loss_after) < float(loss)


def test_update_weights_clips_to_unit_interval():
  cl = jnp.asarray([[[2.0, 0.0]], [[0.0, 2.0]]])
  # Signed steps +0.1 for w1, -0.1 for w2 (as above) push 0.95 -> 1.05 and 0.02 -> -0.08: clipped to [1, 0].
  w, _ = coboosting.update_weights(jnp.asarray([0.95, 0.02]), cl, jnp.asarray([0]), 0.1)
  np.testing.assert_allclose(w, [1.0, 0.0], rtol=1e-6)


def test_ods_perturbation_is_a_signed_step(mlp_method):
  method, params = mlp_method
  teacher = {"clients": params, "weights": jnp.full((3,), 1 / 3)}
  x = jax.random.uniform(jax.random.key(0), (4, S, S, 1))
  fn = lambda v: coboost.teacher_logits(method, teacher, v)
  xp = coboosting.ods_perturb(fn, x, jax.random.key(1), eps=8 / 255)
  d = np.abs(np.asarray(xp - x))
  assert np.all((np.isclose(d, 8 / 255, rtol=1e-4)) | (d == 0)) and np.mean(d > 0) > 0.5
  np.testing.assert_array_equal(coboosting.ods_perturb(fn, x, jax.random.key(1), eps=0.0), x)


def test_synthesis_keeps_the_best_batch_and_fori_loop_matches(mlp_method):
  method, params = mlp_method
  teacher = {"clients": params, "weights": jnp.asarray([0.2, 0.3, 0.5])}
  server = coboosting.init(jax.random.key(5), method, (S, S, 1))
  state = jax.jit(lambda k: coboosting.init_synthesis(k, method, 8, (S, S, 1)))(jax.random.key(2))
  step = jax.jit(lambda s: coboosting.synthesis_step(method, s, teacher, server.params, server.extra))
  seen = []
  for _ in range(3):
    state, m = step(state)
    seen.append(float(m["gen_loss"]))
  chex.assert_shape(state.best_x, (8, S, S, 1))
  np.testing.assert_allclose(float(state.best_loss), min(seen), rtol=1e-6)
  assert int(state.step) == 3
  # The whole phase as one fori_loop (for accelerators) gives the same result.
  looped, _ = jax.jit(lambda k: coboosting.hard_sample_synthesis(method, k, teacher, server.params, server.extra,
                                                                   8, (S, S, 1), 3))(jax.random.key(2))
  np.testing.assert_allclose(looped.best_x, state.best_x, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(looped.z, state.z, rtol=1e-5, atol=1e-6)


def test_distill_step_lowers_kl_and_compiles_once(mlp_method):
  method, params = mlp_method
  teacher = {"clients": params, "weights": jnp.asarray([0.2, 0.3, 0.5])}
  state = coboosting.init(jax.random.key(5), method, (S, S, 1))
  x = jax.random.uniform(jax.random.key(0), (16, S, S, 1))
  t = coboost.teacher_logits(method, teacher, x)

  def kl(st):
    return float(coboosting.kd_loss(method.server.apply({"params": st.params}, x), t, method.kd_temperature))

  before = kl(state)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(st, key):
    return coboosting.distill_step(method, st, teacher, {"x": x}, key, 0.05, coboosting.knobs(method))

  for _ in range(8):
    state, m = step(state, jax.random.key(1))
  assert kl(state) < before
  assert int(state.step) == 8 and np.isfinite(float(m["kd_loss"]))


def test_distill_step_same_on_1_and_8_devices(mlp_method):
  method, params = mlp_method
  teacher = {"clients": params, "weights": jnp.asarray([0.2, 0.3, 0.5])}
  x = np.asarray(jax.random.uniform(jax.random.key(0), (16, S, S, 1)))
  outs = []
  for mesh in sharding.device_meshes((1, 8)):
    state = sharding.replicate(coboosting.init(jax.random.key(5), method, (S, S, 1)), mesh)
    fn = jax.jit(lambda st, b: coboosting.distill_step(method, st, teacher, b, jax.random.key(1), 0.05))
    state, _ = fn(state, sharding.shard_batch({"x": x}, mesh))
    outs.append(jax.device_get(state.params))
  for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
