"""D2 Pruning dataset graph (`papers/d2pruning/dataset_graph.py`): k-NN against brute force, the neighbour table."""
import numpy as np
import pytest

from iclr24_jax.papers import d2pruning
from .helpers import _five_node_graph


def _brute_knn(x, k, groups=None):
  d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
  np.fill_diagonal(d, np.inf)
  if groups is not None:
    d = np.where(groups[:, None] == groups[None, :], d, np.inf)
  idx = np.argsort(d, axis=1, kind="stable")[:, :k]
  return np.sqrt(np.take_along_axis(d, idx, 1)), idx


@pytest.mark.parametrize("use_groups", [False, True])
@pytest.mark.parametrize("symmetric", [True, False])
def test_knn_graph_equals_brute_force(use_groups, symmetric):
  rng = np.random.default_rng(3)
  x = rng.normal(size=(60, 4)).astype(np.float32)
  groups = rng.integers(0, 3, 60) if use_groups else None
  g = d2pruning.knn_graph(x, 4, groups=groups, symmetric=symmetric)
  bd, bi = _brute_knn(x.astype(np.float64), 4, groups)
  want = {}
  for i in range(60):
    for j, d in zip(bi[i], bd[i]):
      want[(int(j), i)] = d  # sender j -> receiver i
      if symmetric:
        want[(i, int(j))] = d
  got = {(int(a), int(b)): float(e) for a, b, e in zip(g.senders, g.receivers, np.asarray(g.edges)[:, 0])}
  assert set(got) == set(want)
  np.testing.assert_allclose([got[e] for e in sorted(want)], [want[e] for e in sorted(want)], rtol=1e-4, atol=1e-4)
  assert np.all(np.diff(np.asarray(g.receivers)) >= 0)  # sorted by receiver
  if use_groups:
    assert np.all(groups[np.asarray(g.senders)] == groups[np.asarray(g.receivers)])


def test_neighbour_table_lists_every_edge():
  g = _five_node_graph()
  nbr, dist = d2pruning.neighbour_table(g, d2pruning.max_degree(g))
  rows = {i: sorted(int(j) for j in np.asarray(nbr[i]) if j < 5) for i in range(5)}
  assert rows == {0: [1], 1: [0, 2], 2: [1, 3], 3: [2, 4], 4: [3]}
  assert np.isinf(np.asarray(dist[0, 1]))  # padding entry
  with pytest.raises(ValueError, match="k_max"):
    d2pruning.neighbour_table(g, 1)
