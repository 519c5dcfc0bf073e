"""jraph through common.graph: the alias shim, padding masks, and the exact kNN graph."""
import numpy as np
import pytest

from iclr24_jax.common import graph as g


def _toy():
  return g.graph_from_edges([0, 1, 2], [1, 2, 0], 3, nodes=np.arange(3.0)[:, None], edges=np.ones((3, 1)))


def test_jraph_functions_that_need_the_shim():
  padded = g.pad_to_budget(_toy(), n_node=8, n_edge=8, n_graph=2)
  zeroed = g.jraph.zero_out_padding(padded)  # calls jax.tree_map inside jraph
  assert zeroed.nodes.shape == (8, 1)
  full = g.jraph.get_fully_connected_graph(3, 1, np.zeros((3, 1)))  # calls jax.tree_leaves/tree_map
  assert int(full.n_edge[0]) == 9


def test_padding_masks_exclude_padding():
  padded = g.pad_to_budget(_toy(), n_node=8, n_edge=6, n_graph=3)
  assert np.asarray(g.node_mask(padded)).tolist() == [True] * 3 + [False] * 5
  assert np.asarray(g.edge_mask(padded)).tolist() == [True] * 3 + [False] * 3
  assert np.asarray(g.graph_mask(padded)).tolist() == [True, False, False]
  # a masked sum-aggregation ignores padding
  msg = padded.nodes[padded.senders] * g.edge_mask(padded)[:, None]
  agg = g.aggregate(msg, padded.receivers, 8)
  np.testing.assert_allclose(np.asarray(agg[:3, 0]), [2.0, 0.0, 1.0])


def test_padding_budget_too_small_is_named():
  with pytest.raises(ValueError, match="padding budget"):
    g.pad_to_budget(_toy(), n_node=3, n_edge=3, n_graph=2)


def _brute_knn(x, k):
  d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
  np.fill_diagonal(d, np.inf)
  idx = np.argsort(d, axis=1, kind="stable")[:, :k]
  return np.sqrt(np.take_along_axis(d, idx, 1)), idx


@pytest.mark.parametrize("block", [7, 64])
def test_knn_matches_brute_force(block):
  x = np.random.default_rng(0).normal(size=(50, 5)).astype(np.float32)
  dist, idx = g.knn(x, 4, block_size=block)
  bd, bi = _brute_knn(x.astype(np.float64), 4)
  np.testing.assert_array_equal(np.asarray(idx), bi)
  np.testing.assert_allclose(np.asarray(dist), bd, rtol=1e-4, atol=1e-4)


def test_knn_graph_symmetric_equals_numpy():
  x = np.random.default_rng(1).normal(size=(30, 3)).astype(np.float32)
  gr = g.knn_graph(x, 3, symmetric=True)
  _, bi = _brute_knn(x.astype(np.float64), 3)
  want = set()
  for i in range(30):
    for j in bi[i]:
      want.add((int(j), i))
      want.add((i, int(j)))
  got = set(zip(np.asarray(gr.senders).tolist(), np.asarray(gr.receivers).tolist()))
  assert got == want and len(gr.senders) == len(want)
  d = np.linalg.norm(x[gr.senders] - x[gr.receivers], axis=1)
  np.testing.assert_allclose(np.asarray(gr.edges[:, 0]), d, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block", [7, 64])
def test_knn_group_mask_matches_brute_force(block):
  rng = np.random.default_rng(2)
  x = rng.normal(size=(40, 3)).astype(np.float32)
  groups = rng.integers(-1, 3, 40)  # three groups and some excluded rows (-1)
  groups[:3] = 5  # a group of 3 members: only 2 neighbours exist, the 3rd and 4th slots are inf
  dist, idx = g.knn(x, 4, block_size=block, groups=groups)
  dist, idx = np.asarray(dist), np.asarray(idx)
  d = ((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1)
  same = (groups[:, None] == groups[None, :]) & (groups[:, None] >= 0)
  d = np.where(same, d, np.inf)
  np.fill_diagonal(d, np.inf)
  for i in range(40):
    want = np.sort(d[i])[:4]
    np.testing.assert_allclose(dist[i], np.sqrt(want), rtol=1e-4, atol=1e-4)
    finite = np.isfinite(dist[i])
    assert np.all(groups[idx[i][finite]] == groups[i])  # every real neighbour is in the row's own group
    assert finite.sum() == min(4, max(int(np.sum(groups == groups[i])) - 1, 0) if groups[i] >= 0 else 0)
  assert np.isfinite(dist[0]).sum() == 2


def test_knn_too_many_neighbours():
  with pytest.raises(ValueError, match="only 4 other points"):
    g.knn(np.zeros((5, 2)), 5)
