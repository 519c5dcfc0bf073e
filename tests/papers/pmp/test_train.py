"""PMP training (`papers/pmp/train.py`): a train step lowers the loss, traced once."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers import pmp
from .helpers import _init_params


def test_train_step_lowers_loss_and_traces_once(tiny_graph):
  model = pmp.PMP(hidden=16)
  tx = optax.adam(0.01)
  state = TrainState.create(_init_params(jax.random.key(0), model, 3, tiny_graph.x.shape[1]), tx)
  batch = jax.tree.map(jnp.asarray, pmp.make_batch(tiny_graph)[0])
  step = jax.jit(chex.assert_max_traces(pmp.make_train_step(model), n=1))
  eval_loss = jax.jit(lambda p, b: pmp.loss_fn(p, model, b, None, train=False)[0])
  loss0 = eval_loss(state.params, batch)
  # Hand check of the loss at init: masked mean of the per-node cross-entropy over training nodes.
  logits = pmp.make_predict(model)(state.params, batch)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
  m = np.asarray(batch["train_mask"])
  np.testing.assert_allclose(float(loss0), float(np.sum(np.asarray(ce) * m) / m.sum()), atol=1e-4)
  for _ in range(15):
    state, metrics = step(state, batch, jax.random.key(1))
  loss1 = eval_loss(state.params, batch)
  assert float(loss1) < float(loss0) - 0.05
  assert int(state.step) == 15
