"""GraphCare patient graphs (`papers/graphcare/graphs.py`): shapes, the visit matrix, collation, the official
global-graph construction, clear errors."""
import chex
import jax
import numpy as np
import pytest

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.papers import graphcare
from iclr24_jax.papers.graphcare import data as data_lib
from iclr24_jax.papers.graphcare import graphs as graphs_lib
from .helpers import _bat


def test_build_patient_graphs_shapes_and_visit_matrix(small_world):
  syn, ckg, _, _ = small_world
  visits = syn.dataset.visits[:3]
  graph, vn = graphcare.build_patient_graphs(visits, ckg)
  n = int(graph.n_node.sum())
  assert graph.n_node.shape == (4,)                               # 3 patients + the padding graph
  chex.assert_shape(graph.nodes["id"], (n,))
  chex.assert_shape(vn, (n, max(len(v) for v in visits)))
  nmask, gmask = np.asarray(graph_lib.node_mask(graph)), np.asarray(graph_lib.graph_mask(graph))
  assert gmask.tolist() == [True, True, True, False]
  assert nmask.sum() == graph.n_node[:3].sum() and not vn[~nmask].any()
  dense = graphs_lib.dense_visit_node_matrix(graph, vn, ckg.num_nodes)
  for g, pv in enumerate(visits):
    assert graph.globals["num_visits"][g] == len(pv)
    for j, visit in enumerate(pv):
      expect = np.zeros(ckg.num_nodes)
      for c in visit:
        expect[ckg.concept_nodes(int(c))] = 1
      np.testing.assert_array_equal(dense[g, j], expect)
    assert not dense[g, len(pv):].any()
  # edges: receivers sorted (segment_sum(indices_are_sorted=True)); every real edge has its reverse
  r, snd = np.asarray(graph.receivers), np.asarray(graph.senders)
  assert np.all(np.diff(r) >= 0)
  real = np.asarray(graph_lib.edge_mask(graph))
  pairs = set(zip(snd[real].tolist(), r[real].tolist()))
  assert all((b, a) in pairs for a, b in pairs)


def test_collate_pairs_cover_each_patient(small_world):
  _, _, pgs, _ = small_world
  out = graphs_lib.collate(pgs[:4], graphs_lib.budgets_for(pgs[:4], 4))
  n_node = out["graph"].n_node
  real = int(n_node[:4].sum())
  pairs = out["pairs"]
  live = pairs[(pairs[:, 0] < real)]
  assert len(live) == int((n_node[:4] ** 2).sum())
  gid = np.repeat(np.arange(len(n_node)), n_node)
  assert np.all(gid[live[:, 0]] == gid[live[:, 1]])
  assert np.all(np.diff(pairs[:, 1]) >= 0)                        # sorted by k
  assert np.all(pairs[len(live):] == real)                        # padding pairs: the padding node


def test_bad_inputs_raise_clear_errors(small_world):
  _, ckg, _, _ = small_world
  with pytest.raises(ValueError, match="outside"):
    graphcare.build_patient_graphs([[[ckg.num_concepts + 5]]], ckg)
  with pytest.raises(ValueError, match="no codes"):
    graphcare.build_patient_graphs([[[0], []]], ckg)
  with pytest.raises(ValueError, match="multiple of num_shards"):
    graphcare.Batcher([], np.zeros(0), batch_size=10, num_shards=4)
  from iclr24_jax.configs import graphcare as cfg
  with pytest.raises(ValueError, match="unknown variant"):
    cfg.get_config("nope")
  with pytest.raises(FileNotFoundError, match="data_dir"):
    data_lib.read_mimic3_demo("/nonexistent/mimic")
  with pytest.raises(ValueError, match="NaN"):
    graphcare.agglomerative_labels(np.array([[1.0, np.nan], [0.0, 1.0]]), 0.15)
  with pytest.raises(ValueError, match="visit_node"):
    graph, vn = graphcare.build_patient_graphs([[[0]]], ckg)
    _bat(ckg).init(jax.random.key(0), graph, vn[:, :, None])


def _hand_kg():
  """5 nodes, 3 relations, 3 concepts (nodes 0, 1, 4) with hand-written triples (head, relation, tail)."""
  from iclr24_jax.papers.graphcare.kg import ConceptKG
  triples = [np.array([[0, 0, 2], [2, 1, 3]]),          # concept 0
             np.array([[1, 2, 2], [3, 2, 2]]),          # concept 1: re-labels the pair {2, 3} with relation 2
             np.array([[4, 0, 0], [0, 1, 3]])]          # concept 2: adds the pair {0, 3}
  return ConceptKG(num_nodes=5, num_relations=3, concept_node=np.array([0, 1, 4]), concept_triples=triples,
                   node_embedding=np.zeros((5, 2), np.float32), relation_embedding=np.zeros((3, 2), np.float32),
                   node_names=list("abcde"), relation_names=["r0", "r1", "r2"], concept_names=["c0", "c1", "c2"],
                   entity_cluster=np.arange(5), relation_cluster=np.arange(3))


def test_official_global_graph_and_patient_cut():
  ckg = _hand_kg()
  g = graphs_lib.global_triples(ckg)
  # one row per unordered pair, the LAST triple written wins ({2, 3}: concept 1's relation 2), sorted by pair
  assert g.tolist() == [[0, 0, 2], [0, 1, 3], [4, 0, 0], [1, 2, 2], [3, 2, 2]]   # pairs {0,2} {0,3} {0,4} {1,2} {2,3}
  # a patient with concept 0 only: nodes {0, 2, 3}
  paper = graphcare.patient_graph([[0]], ckg)
  official = graphcare.patient_graph([[0]], ckg, construction="official")
  np.testing.assert_array_equal(paper.node_ids, [0, 2, 3])
  np.testing.assert_array_equal(official.node_ids, [0, 2, 3])
  def edges(pg):
    return sorted((int(pg.node_ids[s]), int(r), int(pg.node_ids[t]))
                  for s, r, t in zip(pg.senders, pg.relation, pg.receivers))
  # paper: concept 0's own triples, both directions
  assert edges(paper) == [(0, 0, 2), (2, 0, 0), (2, 1, 3), (3, 1, 2)]
  # official: every global edge among the patient's nodes - the pair {2, 3} carries relation 2 (overwritten by
  # concept 1) and the pair {0, 3} comes from concept 2's KG, which is not the patient's
  assert edges(official) == [(0, 0, 2), (0, 1, 3), (2, 0, 0), (2, 2, 3), (3, 1, 0), (3, 2, 2)]
  with pytest.raises(ValueError, match="construction"):
    graphcare.patient_graph([[0]], ckg, construction="global")
