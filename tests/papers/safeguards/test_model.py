"""Safeguards models (`papers/safeguards/model.py`): the front end against scikit-learn, Platt calibration, the
detector's train step."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers import safeguards as sg


def test_front_end_matches_sklearn():
  from sklearn.linear_model import LogisticRegression
  rng = np.random.default_rng(8)
  c = (rng.random((2000, 4)) < 0.5).astype(np.float32)
  y = (rng.random(2000) < 1 / (1 + np.exp(-(c @ np.array([1.0, -2.0, 0.5, 3.0]) - 1.0)))).astype(np.int32)
  params = jax.jit(sg.fit_front_end)(c, y)
  ref = LogisticRegression(C=1.0, max_iter=1000, tol=1e-8).fit(c, y)
  np.testing.assert_allclose(params["w"], ref.coef_[0], atol=1e-3)   # scikit-learn's own tol is ~1e-4
  np.testing.assert_allclose(params["b"], ref.intercept_[0], atol=1e-3)


def test_platt_calibration_recovers_scale_and_shift():
  rng = np.random.default_rng(9)
  z = rng.normal(size=(20000, 2)).astype(np.float32)
  targets = (rng.random(z.shape) < 1 / (1 + np.exp(-(np.array([2.0, 0.5]) * z + np.array([1.0, -0.5]))))
             ).astype(np.float32)
  cal = jax.jit(sg.fit_calibration, static_argnames="method")(z, targets, "platt")
  np.testing.assert_allclose(cal["a"], [2.0, 0.5], atol=0.15)     # ~5 standard errors at N = 20,000
  np.testing.assert_allclose(cal["b"], [1.0, -0.5], atol=0.15)
  temp = sg.fit_calibration(z, targets, "temperature")
  np.testing.assert_allclose(temp["b"], [0.0, 0.0])
  probs = sg.calibrated_probs(z, cal)
  assert float(probs.min()) >= 0 and float(probs.max()) <= 1


def test_detector_train_step_lowers_loss():
  from iclr24_jax.common.train_state import TrainState
  import optax
  model = sg.ConceptMLP(num_concepts=3, hidden=16)
  rng = np.random.default_rng(10)
  x = (rng.random((64, 5)) < 0.7).astype(np.float32)
  c = np.stack([x[:, [0, 1, 3]].sum(1) % 2, x[:, [0, 1, 2]].sum(1) % 2, x[:, [0, 1, 4]].sum(1) % 2], 1)
  batch = {"x": jnp.asarray(x), "c": jnp.asarray(c, jnp.float32)}
  params = model.init(jax.random.key(0), batch["x"])["params"]
  chex.assert_shape(model.apply({"params": params}, batch["x"]), (64, 3))
  # the K detectors are independent: K copies of a 1-hidden-layer MLP
  chex.assert_shape(params["detectors"]["Dense_0"]["kernel"], (3, 5, 16))
  state = TrainState.create(params, optax.adam(1e-2), extra={})
  step = chex.assert_max_traces(sg.make_detector_train_step(model), n=1)
  step = jax.jit(step)
  first = None
  for _ in range(30):
    state, metrics = step(state, batch, jax.random.key(1))
    first = float(metrics["loss"]) if first is None else first
  assert float(metrics["loss"]) < first - 0.05
