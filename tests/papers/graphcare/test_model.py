"""GraphCare models (`papers/graphcare/model.py`): decay weights and bi-attention against the official code, BAT
aggregation by hand, variants, baselines, padding invariance."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.papers import graphcare
from iclr24_jax.papers.graphcare import graphs as graphs_lib
from iclr24_jax.papers.graphcare import model as model_lib
from .helpers import _bat


def test_decay_weights_paper_and_code():
  nv = jnp.array([3, 1])
  lam = np.asarray(graphcare.decay_weights(nv, 4, 0.5))
  # paper: exp(-0.5 (J - 1 - j)) on real visits: J=3 -> [e^-1, e^-0.5, 1, 0]; J=1 -> [1, 0, 0, 0]
  np.testing.assert_allclose(lam, [[np.exp(-1), np.exp(-0.5), 1, 0], [1, 0, 0, 0]], rtol=1e-6)
  code = np.asarray(graphcare.decay_weights(nv, 4, 0.5, match_official_code=True))
  # code: reversed positions p = [2, 1, 0, 3] -> exp(0.5 (4 - p)) = [e^1, e^1.5, e^2, e^0.5]
  np.testing.assert_allclose(code[0], np.exp(0.5 * (4 - np.array([2, 1, 0, 3]))), rtol=1e-6)
  # on real visits the code's weights are the paper's times exp(gamma * V)
  np.testing.assert_allclose(code[0, :3], lam[0, :3] * np.exp(0.5 * 4), rtol=1e-6)


def _official_attention(visit_dense, num_visits, w_a, b_a, w_b, b_b, decay):
  """numpy transcription of the official GraphCare forward's alpha/beta (dense [B, V, M], reversed visits)."""
  bsz, v, mm = visit_dense.shape
  rev = np.zeros_like(visit_dense)
  for b in range(bsz):  # pad_and_convert: latest visit first, zero rows after
    j = int(num_visits[b])
    rev[b, :j] = visit_dense[b, :j][::-1]
  logits = rev @ w_a + b_a
  alpha = np.exp(logits - logits.max(1, keepdims=True))
  alpha = alpha / alpha.sum(1, keepdims=True)                       # softmax(dim=1)
  lam = np.exp(decay * (v - np.arange(v)))[None, :, None]
  beta = np.tanh(rev @ w_b[:, None] + b_b) * lam
  return (alpha * beta).sum(1)                                      # [B, M]


def test_bi_attention_matches_official_code_and_differs_from_paper(small_world):
  _, ckg, pgs, _ = small_world
  shard = graphs_lib.collate(pgs[:6], graphs_lib.budgets_for(pgs[:6], 6))
  graph, vn = jax.tree.map(jnp.asarray, shard["graph"]), jnp.asarray(shard["visit_node"])
  n = vn.shape[0]
  node_graph = model_lib.node_graph_index(graph.n_node, n)
  nmask = graph_lib.node_mask(graph)
  pairs = jnp.asarray(shard["pairs"])
  pmask = nmask[pairs[:, 0]] & nmask[pairs[:, 1]]
  rng = np.random.default_rng(0)
  mm = ckg.num_nodes
  w_a, b_a = rng.normal(size=(mm, mm)).astype(np.float32), rng.normal(size=mm).astype(np.float32)
  w_b, b_b = rng.normal(size=mm).astype(np.float32), np.float32(0.3)
  nv = graph.globals["num_visits"]
  ids = graph.nodes["id"]
  args = (vn, ids, node_graph, nmask, nv, pairs, pmask, w_a, b_a, w_b, b_b, 0.5)
  code_attn, code_alpha, _ = graphcare.bi_attention(*args, match_official_code=True, pairs_sorted=True)
  dense = graphs_lib.dense_visit_node_matrix(shard["graph"], shard["visit_node"], mm)
  ref = _official_attention(dense, np.asarray(nv), w_a, b_a, w_b, b_b, 0.5)
  ng, idn, real = np.asarray(node_graph), np.asarray(ids), np.asarray(nmask)
  np.testing.assert_allclose(np.asarray(code_attn)[real], ref[ng[real], idn[real]], rtol=2e-5, atol=1e-5)
  # code: alpha sums to 1 over ALL visit slots (padded ones included) at every node
  np.testing.assert_allclose(np.asarray(code_alpha)[real].sum(1), 1.0, rtol=1e-5)
  # the O(N^2) fallback pairs give the same numbers
  all_p, all_m = graphcare.all_pairs(node_graph, nmask)
  fb = graphcare.bi_attention(vn, ids, node_graph, nmask, nv, all_p, all_m, w_a, b_a, w_b, b_b, 0.5,
                              match_official_code=True)[0]
  np.testing.assert_allclose(fb, code_attn, rtol=1e-5, atol=1e-6)
  paper_attn, alpha, beta = graphcare.bi_attention(*args)
  alpha, beta, vnp = np.asarray(alpha), np.asarray(beta), np.asarray(vn)
  # paper: alpha is a distribution over the nodes of each real visit, zero elsewhere; beta zero on padded visits
  for g in range(len(graph.n_node) - 1):
    rows = ng == g
    for j in range(vn.shape[1]):
      if j < int(nv[g]):
        np.testing.assert_allclose(alpha[rows, j].sum(), 1.0, rtol=1e-5)
        assert np.all(alpha[rows, j][vnp[rows, j] == 0] == 0)
      else:
        assert np.all(alpha[rows, j] == 0) and beta[g, j] == 0
  assert not np.allclose(np.asarray(paper_attn), np.asarray(code_attn))


def test_bat_aggregate_self_term_and_messages():
  # 3 nodes, edges 0->1 (relation 0) and 2->1 (relation 1); eps = 0.5.
  x = jnp.array([[1.0, -2.0], [0.5, 0.5], [2.0, 1.0]])
  a = jnp.array([2.0, 0.0, -1.0])
  rel_table = jnp.array([[1.0, 1.0], [0.0, 3.0]])
  w_rel = jnp.array([[0.5], [1.0]])
  out = graphcare.bat_aggregate(x, a, jnp.array([0, 2]), jnp.array([1, 1]), jnp.array([0, 1]), rel_table, w_rel, 0.5)
  # m_01 = relu([2, -4] + 0.5 [1, 1]) = [2.5, 0]; m_21 = relu([-2, -1] + [0, 3]) = [0, 2]
  # node 1: [2.5, 2] + 1.5 [0.5, 0.5] = [3.25, 2.75]; nodes 0, 2 get only 1.5 x
  np.testing.assert_allclose(out, [[1.5, -3.0], [3.25, 2.75], [3.0, 1.5]], rtol=1e-6)
  no_edge = graphcare.bat_aggregate(x, a, jnp.array([0, 2]), jnp.array([1, 1]), jnp.array([0, 1]), rel_table, None, 0.0)
  # without edge attention: relu([2, -4]) + relu([-2, -1]) + x_1 = [2.5, 0.5]
  np.testing.assert_allclose(no_edge[1], [2.5, 0.5], rtol=1e-6)


@pytest.mark.parametrize("kw", [dict(), dict(use_alpha=False), dict(use_beta=False), dict(use_edge_attn=False),
                                dict(match_official_code=True), dict(gnn="gin"), dict(gnn="gat"),
                                dict(patient_mode="graph", ehr_readout="final", train_eps=True)])
def test_model_variants_run(small_world, kw):
  _, ckg, _, batcher = small_world
  batch = batcher.batch(np.arange(16))
  model = _bat(ckg, **kw)
  state = graphcare.init(jax.random.key(0), model, batch, optax.adam(1e-3), ckg.node_embedding,
                               ckg.relation_embedding)
  logits = graphcare.apply_batch(model, state.params, batch)   # eager: eight compiles would cost more
  chex.assert_shape(logits, (8, 3, 1))                           # 8 shards x (2 patients + padding graph)
  chex.assert_tree_all_finite(logits)


def test_ehr_gru_baseline_ignores_the_kg(small_world):
  _, ckg, _, batcher = small_world
  batch = batcher.batch(np.arange(16))
  model = graphcare.EHRGRU(num_nodes=ckg.num_nodes, out_dim=1, embedding_dim=ckg.embedding_dim, hidden_dim=8)
  state = graphcare.init(jax.random.key(0), model, batch, optax.adam(1e-3))
  apply = lambda p, b: graphcare.apply_batch(model, p, b)
  out = apply(state.params, batch)
  cut = dict(batch, graph=batch["graph"]._replace(senders=np.zeros_like(batch["graph"].senders)))
  np.testing.assert_allclose(out, apply(state.params, cut), rtol=1e-6)


@pytest.mark.parametrize("official", [False, True])
def test_padding_does_not_change_real_outputs(small_world, official):
  _, ckg, pgs, _ = small_world
  model = _bat(ckg, match_official_code=official)
  tight = graphs_lib.budgets_for(pgs[:5], 5)
  # more graphs (an empty filler), nodes, edges, pairs and codes; more visit slots only in paper mode
  # (the official decay and softmax over visits depend on max_visit by design)
  loose = graphs_lib.Budgets(graphs=8, nodes=tight.nodes + 40, edges=tight.edges + 24,
                             visits=tight.visits + (0 if official else 2), pairs=tight.pairs + 64,
                             codes_per_visit=tight.codes_per_visit + 1)
  a = graphs_lib.collate(pgs[:5], tight)
  b = graphs_lib.collate(pgs[:5] + [None], loose)
  params = model.init(jax.random.key(0), a["graph"], a["visit_node"], a["codes"], a["pairs"])
  apply = lambda p, s: model.apply(p, s["graph"], s["visit_node"], s["codes"], s["pairs"])
  np.testing.assert_allclose(apply(params, a)[:5], apply(params, b)[:5], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gnn", ["gin", "gat"])
def test_baselines_see_relation_types_only_with_edge_types(small_world, gnn):
  _, ckg, _, batcher = small_world
  batch = batcher.batch(np.arange(16))
  flipped = jax.tree.map(lambda x: x, batch)
  g = flipped["graph"]
  flipped["graph"] = g._replace(edges={"relation": (np.asarray(g.edges["relation"]) + 1) % ckg.num_relations})
  for edge_types in (False, True):
    model = _bat(ckg, gnn=gnn, edge_types=edge_types)
    state = graphcare.init(jax.random.key(0), model, batch, optax.adam(1e-3), ckg.node_embedding,
                                 ckg.relation_embedding)
    a = np.asarray(graphcare.apply_batch(model, state.params, batch))
    b = np.asarray(graphcare.apply_batch(model, state.params, flipped))
    if edge_types:
      assert np.abs(a - b).max() > 1e-4          # relation ids change the logits
    else:
      np.testing.assert_array_equal(a, b)        # the official baselines ignore them
