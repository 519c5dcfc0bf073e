"""D2 Pruning message passing (`papers/d2pruning/message_passing.py`): forward and reverse passes by hand on five
nodes, the official dense algorithm, jittable selection, padding invariance."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.papers import d2pruning
from .helpers import SCORES5, _five_node_graph, _official_dense_select


def test_forward_message_passing_five_nodes_by_hand():
  g = _five_node_graph()
  # gamma_f = 1: edge kernels exp(-0) = 1 and exp(-ln 2) = 0.5; w_ij = k_ij * s_j.
  # rho_0 = 1 + 1*2              = 3
  # rho_1 = 2 + 1*1 + 0.5*3      = 4.5
  # rho_2 = 3 + 0.5*2 + 1*0      = 4
  # rho_3 = 0 + 1*3 + 0.5*4      = 5
  # rho_4 = 4 + 0.5*0            = 4
  rho = d2pruning.forward_message_passing(g, jnp.asarray(SCORES5), gamma=1.0, mode="sum")
  np.testing.assert_allclose(np.asarray(rho), [3.0, 4.5, 4.0, 5.0, 4.0], rtol=1e-6)
  # product: rho_i = s_i * sum_j w_ij = [1*2, 2*(1+1.5), 3*(1+0), 0*(3+2), 4*0] = [2, 5, 3, 0, 0]
  rho_p = d2pruning.forward_message_passing(g, jnp.asarray(SCORES5), gamma=1.0, mode="product")
  np.testing.assert_allclose(np.asarray(rho_p), [2.0, 5.0, 3.0, 0.0, 0.0], rtol=1e-6)
  # gamma_f = 2 halves the kernel exponent scale: exp(-2 ln 2) = 0.25 -> rho_1 = 2 + 1 + 0.25*3 = 3.75
  rho_g = d2pruning.forward_message_passing(g, jnp.asarray(SCORES5), gamma=2.0)
  np.testing.assert_allclose(float(rho_g[1]), 3.75, rtol=1e-6)


@pytest.mark.parametrize("block_size", [0, 2])
def test_reverse_message_passing_five_nodes_by_hand(block_size):
  g = _five_node_graph()
  rho = jnp.asarray([3.0, 4.5, 4.0, 5.0, 4.0])  # the forward pass above
  # gamma_r = 1 (kernels 1 and 0.5):
  # pick 3 (5):   rho_2 = 4 - 1*5 = -1,      rho_4 = 4 - 0.5*5 = 1.5   -> [3, 4.5, -1, x, 1.5]
  # pick 1 (4.5): rho_0 = 3 - 1*4.5 = -1.5,  rho_2 = -1 - 0.5*4.5 = -3.25 -> [-1.5, x, -3.25, x, 1.5]
  # pick 4 (1.5), then 0 (-1.5), then 2 (-3.25). Node 2 started 3rd-highest but lies next to 3 and 1.
  sel = d2pruning.reverse_message_passing_select(g, rho, 5, gamma=1.0, block_size=block_size)
  assert np.asarray(sel).tolist() == [3, 1, 4, 0, 2]
  sel3 = d2pruning.reverse_message_passing_select(g, rho, 3, gamma=1.0, block_size=block_size)
  assert np.asarray(sel3).tolist() == [3, 1, 4]


@pytest.mark.parametrize("block_size,chunk", [(0, 16), (8, 16), (8, 3)])
def test_d2_matches_official_dense_algorithm(block_size, chunk):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(80, 4)).astype(np.float32)
  s = (rng.random(80) * 3).astype(np.float32)
  g = d2pruning.knn_graph(x, 6)
  rho = d2pruning.forward_message_passing(g, jnp.asarray(s), gamma=1.0)
  assert d2pruning.max_degree(g) > chunk or chunk == 16  # chunk=3: several inner update steps per pick
  ours = d2pruning.reverse_message_passing_select(g, rho, 40, gamma=0.3, block_size=block_size, chunk=chunk)
  ref = _official_dense_select(x.astype(np.float64), s.astype(np.float64), 40, 6, 0.3)
  np.testing.assert_array_equal(np.asarray(ours), ref)


def test_reverse_select_is_jittable_never_repeats_and_respects_budget():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(120, 5)).astype(np.float32)
  g = d2pruning.knn_graph(x, 5)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def select(senders, receivers, edges, s):
    graph = g._replace(senders=senders, receivers=receivers, edges=edges)
    return d2pruning.reverse_message_passing_select(graph, s, 100, gamma=0.1)

  for seed in range(3):
    s = jnp.asarray(np.random.default_rng(seed).random(120), jnp.float32)
    out = np.asarray(select(g.senders, g.receivers, g.edges, s))
    chex.assert_shape(out, (100,))
    assert out.dtype == np.int32
    assert len(set(out.tolist())) == 100 and out.min() >= 0 and out.max() < 120
  eligible = np.arange(120) % 3 != 0  # 80 eligible
  out = np.asarray(d2pruning.reverse_message_passing_select(g, s, 80, eligible=jnp.asarray(eligible)))
  assert set(out.tolist()) == set(np.flatnonzero(eligible).tolist())


def test_padding_does_not_change_results():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(50, 3)).astype(np.float32)
  s = rng.random(50).astype(np.float32)
  g = d2pruning.knn_graph(x, 4)
  padded = graph_lib.pad_to_budget(g, n_node=64, n_edge=int(g.n_edge[0]) + 37, n_graph=3)
  mask = graph_lib.node_mask(padded)
  s_pad = jnp.concatenate([jnp.asarray(s), jnp.full((14,), 5.0)])  # large padding scores must not matter
  rho = d2pruning.forward_message_passing(g, jnp.asarray(s))
  rho_pad = d2pruning.forward_message_passing(padded, s_pad)
  np.testing.assert_allclose(np.asarray(rho_pad[:50]), np.asarray(rho), rtol=1e-6)
  sel = d2pruning.reverse_message_passing_select(g, rho, 30)
  sel_pad = d2pruning.reverse_message_passing_select(padded, rho_pad, 30, node_mask=mask)
  np.testing.assert_array_equal(np.asarray(sel_pad), np.asarray(sel))
  nbr, dist = d2pruning.neighbour_table(g, d2pruning.max_degree(g))  # the padded-table form: same picks
  np.testing.assert_array_equal(np.asarray(d2pruning.select_from_table(nbr, dist, rho, 30, 0.1)), np.asarray(sel))
