"""PMP data (`papers/pmp/data.py`): the synthetic fraud graph, the CARE-GNN and Geom-GCN loaders, neighbour label
counts."""
import numpy as np
import pytest

from iclr24_jax.papers import pmp


def test_generator_is_imbalanced_and_fraud_heterophilic():
  d = pmp.make_fraud_graph(num_nodes=2000, seed=0)
  desc = d.describe()
  assert 0.05 <= desc["fraud_ratio"] <= 0.15
  assert len(d.relations) == 3
  for rel, (benign_h, fraud_h) in desc["class_homophily"].items():
    assert fraud_h < 0.5 < benign_h, rel
  for s, r in d.relations:   # undirected, no self-loops
    assert not np.any(s == r)
    fwd = set(zip(s.tolist(), r.tolist()))
    assert fwd == set(zip(r.tolist(), s.tolist()))
  assert len(np.intersect1d(d.train_idx, d.test_idx)) == 0
  assert len(d.train_idx) == pytest.approx(0.4 * 2000, abs=2)


def test_fraud_mat_loader(tmp_path):
  import scipy.io
  import scipy.sparse as sp
  rng = np.random.default_rng(0)
  n = 3400
  def rel(e):
    s, r = rng.integers(0, n, e), rng.integers(0, n, e)
    return sp.coo_matrix((np.ones(e), (s, r)), shape=(n, n)).tocsc()
  rels = {k: rel(500) for k in ("net_upu", "net_usu", "net_uvu")}
  scipy.io.savemat(tmp_path / "Amazon.mat", {"features": rng.random((n, 5)), "label": (rng.random((1, n)) < 0.1) * 1.0,
                                             "homo": rel(10), **rels})
  d = pmp.load_fraud_mat("amazon", tmp_path)
  assert len(d.relations) == 3            # the official run trains the three relations (its homo flag is unread)
  split = np.concatenate([d.train_idx, d.val_idx, d.test_idx])
  assert split.min() >= 3305 and len(split) == n - 3305                 # unlabelled users excluded
  assert len(d.train_idx) == int(0.4 * (n - 3305))
  assert np.all(d.x.sum(1) < 1.0)                                        # x / (row sum + 0.01)
  d1 = pmp.load_fraud_mat("amazon", tmp_path, homo=True)
  assert d1.relation_names == ("homo",) and len(d1.relations) == 1
  assert len(d1.relations[0][0]) == sum(len(s) for s, _ in d.relations)   # merged, duplicates kept
  with pytest.raises(FileNotFoundError, match="CARE-GNN"):
    pmp.load_fraud_mat("yelpchi", tmp_path)


def test_geom_gcn_loader(shared_data):
  d = pmp.load_geom_gcn("texas", root=shared_data / "geom_gcn")
  assert d.num_nodes == 183 and d.num_classes == 5 and d.x.shape == (183, 1703)
  s, r = d.relations[0]
  assert set(zip(s.tolist(), r.tolist())) == set(zip(r.tolist(), s.tolist()))
  assert set(np.unique(d.label_state())) <= set(range(6))


def test_neighbour_label_counts_hand_example():
  from iclr24_jax.papers.pmp import data as data_lib
  # 4 nodes, train = {0 (benign), 1 (fraud)}; relation 0: 0->2, 1->2, 2->3; relation 1: 1->3, 3->0.
  x = np.zeros((4, 2), np.float32)
  rels = ((np.array([0, 1, 2]), np.array([2, 2, 3])), (np.array([1, 3]), np.array([3, 0])))
  d = data_lib.GraphData("hand", x, np.array([0, 1, 1, 0], np.int32), rels, ("a", "b"), np.array([0, 1]),
                         np.array([2]), np.array([3]), 2)
  c = data_lib.neighbour_label_counts(d)       # columns: rel a (benign, fraud, unknown), rel b (same)
  np.testing.assert_array_equal(c, [[0, 0, 0, 0, 0, 1],      # node 0 hears node 3 (unknown) in b
                                    [0, 0, 0, 0, 0, 0],
                                    [1, 1, 0, 0, 0, 0],      # node 2 hears 0 (benign) and 1 (fraud) in a
                                    [0, 0, 1, 0, 1, 0]])     # node 3 hears 2 (unknown: val) in a, 1 (fraud) in b
  d2 = data_lib.with_neighbour_labels(d)
  assert d2.x.shape == (4, 8) and d2.labels is d.labels
  # the val/test labels never enter: flipping them leaves the counts unchanged
  d3 = data_lib.GraphData("hand", x, np.array([0, 1, 0, 1], np.int32), rels, ("a", "b"), d.train_idx, d.val_idx,
                          d.test_idx, 2)
  np.testing.assert_array_equal(data_lib.neighbour_label_counts(d3), c)
