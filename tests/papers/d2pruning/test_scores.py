"""D2 Pruning scores (`papers/d2pruning/scores.py`): example statistics and scores from training dynamics by hand, a
train step compiled once, the dynamics trainer."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers import d2pruning
from iclr24_jax.papers.d2pruning import scores as scores_lib
from .helpers import _tiny_cfg


def test_example_stats_by_hand():
  # logits [0, ln 3] -> softmax [0.25, 0.75]; label 0: p_gold 0.25, wrong, margin 0.25 - 0.75 = -0.5,
  # el2n = ||[0.25 - 1, 0.75]|| = sqrt(0.5625 + 0.5625) = 1.06066
  st = d2pruning.example_stats(jnp.asarray([[0.0, np.log(3.0)]]), jnp.asarray([0]))
  np.testing.assert_allclose(float(st["p_gold"][0]), 0.25, rtol=1e-6)
  assert not bool(st["correct"][0])
  np.testing.assert_allclose(float(st["margin"][0]), -0.5, rtol=1e-6)
  np.testing.assert_allclose(float(st["el2n"][0]), np.sqrt(1.125), rtol=1e-6)


def test_scores_from_dynamics_by_hand():
  dyn = {"correct": np.asarray([[1, 0], [0, 1], [1, 1], [0, 1]], bool),  # [E=4, N=2]
         "p_gold": np.asarray([[0.6, 0.2], [0.4, 0.6], [0.6, 0.8], [0.4, 0.8]]),
         "margin": np.asarray([[0.2, -0.5], [-0.1, 0.3], [0.3, 0.7], [-0.2, 0.7]]),
         "el2n": np.asarray([[0.5, 1.0], [0.7, 0.5], [0.4, 0.2], [0.9, 0.2]])}
  sc = d2pruning.scores_from_dynamics(dyn, el2n_epochs=2)
  # example 0 is correct, wrong, correct, wrong: forgotten twice; example 1 is learned once, never forgotten
  np.testing.assert_array_equal(sc["forgetting"], [2, 0])
  np.testing.assert_allclose(sc["aum"], [0.2 - 0.1 + 0.3 - 0.2, -0.5 + 0.3 + 0.7 + 0.7], rtol=1e-6)
  np.testing.assert_allclose(sc["el2n"], [0.5 + 0.7, 1.0 + 0.5], rtol=1e-6)
  # variance of [0.6, 0.4, 0.6, 0.4] = 0.01; of [0.2, 0.6, 0.8, 0.8]: mean 0.6, (0.16+0+0.04+0.04)/4 = 0.06
  np.testing.assert_allclose(sc["variance"], [0.01, 0.06], rtol=1e-6)
  np.testing.assert_allclose(d2pruning.as_difficulty(sc, "aum"), [1.2 - 0.2, 0.0], atol=1e-6)


def test_train_step_lowers_loss_compiled_once(digits_small):
  from iclr24_jax.papers.d2pruning import model as model_lib
  from iclr24_jax.vision import classify
  cfg = _tiny_cfg()
  model, tx = model_lib.create_classifier(cfg, 10, 100)
  state = classify.init(jax.random.key(0), model, digits_small.input_shape, tx)
  batch = {"x": jnp.asarray(digits_small.train.x[:64]), "y": jnp.asarray(digits_small.train.y[:64]),
           "mask": jnp.ones(64)}
  step = jax.jit(chex.assert_max_traces(scores_lib.make_train_step(model), n=1))
  losses = []
  for _ in range(15):
    state, metrics, stats = step(state, batch, jax.random.key(1))
    losses.append(float(metrics["loss"]))
  chex.assert_shape(stats["p_gold"], (64,))
  assert losses[-1] < losses[0] - 0.3


def test_dynamics_trainer_shapes(digits_small):
  from iclr24_jax.papers.d2pruning import model as model_lib
  cfg = _tiny_cfg()
  model, tx = model_lib.create_classifier(cfg, 10, 6)
  train = jax.jit(d2pruning.make_dynamics_trainer(model, tx, digits_small.input_shape, 3, 64))
  x, y = digits_small.train.x[:150], digits_small.train.y[:150]  # 150 = 2 full batches + 22 (padded)
  state, dyn, metrics = train(jax.random.key(0), x, y)
  for k in ("p_gold", "correct", "margin", "el2n"):
    chex.assert_shape(dyn[k], (3, 150))
  chex.assert_shape(metrics["loss"], (3,))
  assert int(state.step) == 9
  assert np.all((np.asarray(dyn["p_gold"]) > 0) & (np.asarray(dyn["p_gold"]) < 1))  # every example visited
