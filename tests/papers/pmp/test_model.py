"""PMP layer and model (`papers/pmp/model.py`): the layer by hand, the reduction to GraphSAGE, padding and
label-leak invariances, clear errors."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.papers import pmp
from iclr24_jax.papers.pmp import data as data_lib
from .helpers import _init_params


# Compiled once per static setting (eager calls would compile every primitive separately).
_partition = jax.jit(pmp.partition_messages, static_argnames=("num_classes", "aggregation", "activation"))
_sage = jax.jit(pmp.sage_messages, static_argnames=("aggregation", "activation"))


def _random_graph(rng, n=12, e=40):
  s = rng.integers(0, n, e).astype(np.int32)
  r = rng.integers(0, n, e).astype(np.int32)
  return graph_lib.graph_from_edges(s, r, n)


@functools.lru_cache(maxsize=None)
def _layer_params(seed, f, h, num_classes=2):
  layer = pmp.PMPLayer(h, num_classes=num_classes)
  g = graph_lib.graph_from_edges([0], [1], 2)
  return jax.jit(lambda k: layer.init(k, g, jnp.ones((2, f)), jnp.zeros((2,), jnp.int32))["params"])(
      jax.random.key(seed))


# --------------------------------------------------------------------------------------------------------
# The layer.


def test_layer_hand_computed():
  # 3 nodes, F = H = 1, edges 1 -> 0 and 2 -> 0; node 1 is a known fraud, nodes 0, 2 unknown.
  g = graph_lib.graph_from_edges([1, 2], [0, 0], 3)
  h = jnp.array([[1.0], [2.0], [4.0]])
  state = jnp.array([2, 1, 2], jnp.int32)
  p = {"self_kernel": jnp.array([[1.0]]), "self_bias": jnp.array([0.0]),
       "class_kernel": jnp.array([[[2.0]], [[3.0]]]),            # W_benign = 2, W_fraud = 3
       "class_bias": jnp.array([[0.2], [0.1]]),                  # b_benign = 0.2, b_fraud = 0.1
       "trans_kernel": jnp.array([[[0.0]], [[0.5]]]),            # T_benign h = 0 h + 1, T_fraud h = 0.5 h + 0
       "trans_bias": jnp.array([[1.0], [0.0]]),
       "alpha_kernel_1": jnp.zeros((1, 4)), "alpha_bias_1": jnp.zeros((4,)),
       "alpha_kernel_2": jnp.zeros((4, 1)), "alpha_bias_2": jnp.zeros((1,))}   # alpha = sigmoid(0) = 0.5
  out = _partition(g, h, state, p)
  # node 0: self 1*1 = 1; T_fr h_0 = 0.5, T_be h_0 = 1.
  #   fraud partition {1}: 3 * (2 * 0.5) + 0.1 = 3.1;  benign partition {}: 2 * 0 + 0.2 = 0.2
  #   unknown {2}: 0.5 * (3 * (4 * 0.5) + 0.1) + 0.5 * (2 * (4 * 1) + 0.2) = 0.5 * 6.1 + 0.5 * 8.2 = 7.15
  #   total 1 + 3.1 + 0.2 + 7.15 = 11.45
  # node 1 (no in-edges): 2 + biases 0.1 + 0.2 + 0.5 * 0.1 + 0.5 * 0.2 = 2.45; node 2: 4 + 0.45 = 4.45
  np.testing.assert_allclose(np.asarray(out[:, 0]), [11.45, 2.45, 4.45], rtol=1e-6)
  chex.assert_shape(out, (3, 1))
  assert out.dtype == jnp.float32


@pytest.mark.parametrize("num_classes", [2, 3])
@pytest.mark.parametrize("aggregation", ["sum", "mean"])
def test_reduces_to_graphsage(num_classes, aggregation):
  """W_c all equal, T_c h_v = 1 (T = 0, t = 1): PMP == a GraphSAGE layer with the same aggregation.

  The biases contribute sum_c b (1 + alpha_c) = (C + 1) b, so with b = 0 the layers are identical and with
  b != 0 GraphSAGE's self bias absorbs (C + 1) b. Checked in float32 to rtol 1e-5, and for the official
  setting (C = 2, sum) also in float64 to 1e-12 (exact up to summation order).
  """
  rng = np.random.default_rng(0)
  g = _random_graph(rng)
  f, hdim = 5, 7
  cases = ((jnp.float64, 1e-12), (jnp.float32, 1e-5)) if (num_classes, aggregation) == (2, "sum") else \
      ((jnp.float32, 1e-5),)
  for dtype, tol in cases:
    with jax.enable_x64(dtype == jnp.float64):
      p = jax.tree.map(lambda a: jnp.asarray(a, dtype), _layer_params(1, f, hdim, num_classes))
      w = jnp.asarray(rng.normal(size=(f, hdim)), dtype)
      b = jnp.asarray(rng.normal(size=(hdim,)), dtype)
      p = dict(p, class_kernel=jnp.stack([w] * num_classes), class_bias=jnp.stack([b] * num_classes),
               trans_kernel=jnp.zeros_like(p["trans_kernel"]), trans_bias=jnp.ones_like(p["trans_bias"]))
      h = jnp.asarray(rng.normal(size=(12, f)), dtype)
      state = jnp.asarray(rng.integers(0, num_classes + 1, 12), jnp.int32)
      got = _partition(g, h, state, p, num_classes=num_classes, aggregation=aggregation)
      sage = {"self_kernel": p["self_kernel"], "self_bias": p["self_bias"] + (num_classes + 1) * b,
              "neigh_kernel": w}
      want = _sage(g, h, sage, aggregation=aggregation)
      assert got.dtype == dtype
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)
      # ... and with zero class biases the two layers are literally the same GraphSAGE layer.
      p0 = dict(p, class_bias=jnp.zeros_like(p["class_bias"]))
      sage0 = dict(sage, self_bias=p["self_bias"])
      np.testing.assert_allclose(np.asarray(_partition(g, h, state, p0, num_classes=num_classes,
                                                       aggregation=aggregation)),
                                 np.asarray(_sage(g, h, sage0, aggregation=aggregation)), rtol=tol, atol=tol)


def test_partition_follows_the_label_state():
  # Moving a neighbour from 'fraud' to 'benign' changes the output; relabelling the receiver does not.
  rng = np.random.default_rng(1)
  g = graph_lib.graph_from_edges([1, 2, 3], [0, 0, 0], 4)
  h = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
  p = _layer_params(0, 3, 5)
  base = _partition(g, h, jnp.array([2, 1, 0, 2]), p)
  moved = _partition(g, h, jnp.array([2, 0, 0, 2]), p)
  own = _partition(g, h, jnp.array([1, 1, 0, 2]), p)
  assert not np.allclose(np.asarray(base[0]), np.asarray(moved[0]))
  np.testing.assert_array_equal(np.asarray(base[0]), np.asarray(own[0]))


# --------------------------------------------------------------------------------------------------------
# Invariances of the whole model.


@pytest.fixture(scope="module")
def pmp_model_and_params(tiny_graph):
  model = pmp.PMP(hidden=16)
  params = _init_params(jax.random.key(0), model, 3, tiny_graph.x.shape[1])
  fwd = jax.jit(lambda p, gs, x, ls: model.apply({"params": p}, gs, x, ls))
  return model, params, fwd


def _graphs(data):
  return [graph_lib.graph_from_edges(s, r, data.num_nodes) for s, r in data.relations]


def test_padding_does_not_change_real_nodes(tiny_graph, pmp_model_and_params):
  _, params, fwd = pmp_model_and_params
  d = tiny_graph
  state = jnp.asarray(d.label_state())
  plain = fwd(params, _graphs(d), jnp.asarray(d.x), state)
  chex.assert_shape(plain, (d.num_nodes, 2))
  batch, info = pmp.make_batch(d, node_multiple=128, edge_multiple=128)
  assert info["node_budget"] > d.num_nodes and all(b >= len(s) for b, (s, _) in zip(info["edge_budgets"], d.relations))
  junk = np.asarray(batch["x"]).copy()
  junk[d.num_nodes:] = np.random.default_rng(0).normal(size=junk[d.num_nodes:].shape) * 100.0  # padding features
  state_p = np.asarray(batch["label_state"]).copy()
  state_p[d.num_nodes:] = 1                                                                   # and padding states
  padded = fwd(params, data_lib.batch_graphs(jax.tree.map(jnp.asarray, batch)), jnp.asarray(junk),
               jnp.asarray(state_p))
  np.testing.assert_allclose(np.asarray(padded[:d.num_nodes]), np.asarray(plain), rtol=1e-5, atol=1e-6)


def test_val_test_labels_never_enter(tiny_graph, pmp_model_and_params):
  _, params, fwd = pmp_model_and_params
  d = tiny_graph
  flipped = d.labels.copy()
  hidden = np.concatenate([d.val_idx, d.test_idx])
  flipped[hidden] = 1 - flipped[hidden]
  import dataclasses
  d2 = dataclasses.replace(d, labels=flipped)
  np.testing.assert_array_equal(d.label_state(), d2.label_state())
  a = fwd(params, _graphs(d), jnp.asarray(d.x), jnp.asarray(d.label_state()))
  b = fwd(params, _graphs(d2), jnp.asarray(d2.x), jnp.asarray(d2.label_state()))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The check is not vacuous: flipping TRAINING labels does change the logits.
  flipped_train = d.labels.copy()
  flipped_train[d.train_idx] = 1 - flipped_train[d.train_idx]
  c = fwd(params, _graphs(d), jnp.asarray(d.x), jnp.asarray(pmp.label_state_from_split(flipped_train, d.train_idx)))
  assert not np.allclose(np.asarray(a), np.asarray(c))
  assert set(np.unique(d.label_state()[hidden])) == {2}


# --------------------------------------------------------------------------------------------------------
# Clear errors.


def test_clear_errors(tiny_graph):
  from iclr24_jax.configs import pmp as cfg_mod
  from iclr24_jax.papers.pmp import experiment
  g = graph_lib.graph_from_edges([0], [1], 3)
  p = _layer_params(0, 2, 3)
  h = jnp.ones((3, 2))
  with pytest.raises(ValueError, match="aggregation"):
    pmp.partition_messages(g, h, jnp.zeros(3, jnp.int32), p, aggregation="max")
  with pytest.raises(ValueError, match="label_state must be"):
    pmp.partition_messages(g, h, jnp.zeros(4, jnp.int32), p)
  with pytest.raises(ValueError, match=r"\[0, 2\]"):
    pmp.partition_messages(g, h, jnp.array([0, 3, 1], jnp.int32), p)
  with pytest.raises(ValueError, match="NaN"):
    pmp.partition_messages(g, h.at[0, 0].set(jnp.nan), jnp.zeros(3, jnp.int32), p)
  with pytest.raises(ValueError, match="unknown or conflicting variant"):
    cfg_mod.get_config("imagenet")
  with pytest.raises(FileNotFoundError, match="data_dir"):   # common.data.DataNotFoundError
    experiment.load_graph(cfg_mod.get_config("yelpchi").data)
  with pytest.raises(ValueError, match="fraud_ratio"):
    pmp.make_fraud_graph(fraud_ratio=0.7)
