"""Tests of GraphCare: KG clustering, patient graphs, the BAT attention (paper vs official code), metrics, training."""
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.common import sharding
from iclr24_jax.papers import graphcare
from iclr24_jax.papers.graphcare import data as data_lib
from iclr24_jax.papers.graphcare import graphs as graphs_lib
from iclr24_jax.papers.graphcare import metrics as m
from iclr24_jax.papers.graphcare import model as model_lib


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def small_world():
  """A small synthetic world: clustered KG, patient graphs, an 8-shard batcher."""
  syn = graphcare.make_synthetic_ehr(seed=0, num_patients=96, num_concepts=40, num_entities=20, num_risk=3,
                                     concept_degree=2, entity_degree=2, codes_per_visit=(1, 3), max_visits=4)
  ckg = graphcare.cluster_kg(syn.raw_kg, syn.entity_embedding, syn.relation_embedding, threshold=0.15)
  pgs = [graphcare.patient_graph(v, ckg) for v in syn.dataset.visits]
  batcher = graphcare.Batcher(pgs, syn.dataset.labels, batch_size=16, num_shards=8)
  return syn, ckg, pgs, batcher


def _init(model, batch, tx, node_embedding=None, relation_embedding=None):
  return jax.jit(lambda k: graphcare.init(k, model, batch, tx, node_embedding, relation_embedding))(
      jax.random.key(0))


def _bat(ckg, **kw):
  base = dict(num_nodes=ckg.num_nodes, num_relations=ckg.num_relations, out_dim=1, embedding_dim=ckg.embedding_dim,
              hidden_dim=8, num_layers=1, dropout=0.0, gnn_dropout=0.0, decay_rate=0.5)
  base.update(kw)
  return graphcare.BAT(**base)


# ------------------------------------------------------------------------------------------------ KG


def test_cluster_kg_merges_near_duplicates_and_drops_self_loops():
  raw = graphcare.kg_from_triples({"a": [("a", "causes", "x"), ("x", "causes", "x2")], "b": [("b", "leads to", "x2")]},
                                  link_heads=False)
  # entities: a, x, x2, b; x and x2 are near-duplicates (cosine distance ~0.005 < 0.15).
  ent = np.array([[1, 0, 0], [0, 1, 0.1], [0, 1, 0.0], [0, 0, 1]], np.float32)
  rel = np.array([[1, 0, 0], [1, 0.05, 0]], np.float32)  # causes ~ leads to
  ckg = graphcare.cluster_kg(raw, ent, rel, threshold=0.15)
  assert ckg.num_nodes == 3 and ckg.num_relations == 1
  assert ckg.entity_cluster[1] == ckg.entity_cluster[2]
  np.testing.assert_allclose(ckg.node_embedding[ckg.entity_cluster[1]], [0, 1, 0.05], rtol=1e-6)
  # concept a: (a, causes, x) survives, (x, causes, x2) became a self-loop and is dropped.
  assert ckg.concept_triples[0].tolist() == [[ckg.concept_node[0], 0, ckg.entity_cluster[1]]]
  # official-code quirk: relation cluster embedding = mean of ENTITY rows at the relation indices.
  q = graphcare.cluster_kg(raw, ent, rel, threshold=0.15, match_official_code=True)
  np.testing.assert_allclose(q.relation_embedding[0], ent[:2].mean(0), rtol=1e-6)


def test_agglomerative_labels_match_sklearn():
  from sklearn.cluster import AgglomerativeClustering
  rng = np.random.default_rng(0)
  centers = rng.normal(size=(12, 16))
  x = np.repeat(centers, 4, 0) + 0.1 * rng.normal(size=(48, 16))
  for t in (0.05, 0.15, 0.4):
    ours = graphcare.agglomerative_labels(x, t)
    ref = AgglomerativeClustering(n_clusters=None, distance_threshold=t, linkage="average",
                                  metric="cosine").fit_predict(x)
    # same partition: pairs in the same cluster agree
    np.testing.assert_array_equal(ours[:, None] == ours[None, :], ref[:, None] == ref[None, :])


def test_propose_triples_hook_with_a_fixed_generator():
  answers = {"sepsis": "[sepsis, causes, Septic Shock]\n(sepsis, treated with, antibiotics)\n[bad]",
             "asthma": "Sure! [asthma, affects, lung] [asthma, affects, lung] [asthma, treated with, inhaler]"}

  def gen(prompt):
    assert "triples about:" in prompt
    return next(v for k, v in answers.items() if prompt.rstrip().endswith(k))

  out = graphcare.propose_triples(gen, ["sepsis", "asthma"], max_triples=5)
  assert out["sepsis"] == [("sepsis", "causes", "septic shock")]  # [..] form wins over (..) when both occur
  assert out["asthma"] == [("asthma", "affects", "lung"), ("asthma", "treated with", "inhaler")]
  raw = graphcare.kg_from_triples(out)
  assert raw.concept_names == ["sepsis", "asthma"]
  assert raw.entity_names[raw.concept_entity[1]] == "asthma"
  with pytest.raises(TypeError, match="generate_fn"):
    graphcare.propose_triples("not callable", ["x"])


# ------------------------------------------------------------------------------------------------ graphs


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


# ------------------------------------------------------------------------------------------------ attention


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


# ------------------------------------------------------------------------------------------------ metrics


def test_metrics_match_sklearn():
  import sklearn.metrics as skm
  rng = np.random.default_rng(0)
  y = rng.integers(0, 2, 200)
  p = np.round(rng.random(200) * 0.5 + 0.4 * y, 2)  # ties on purpose
  pred = (p >= 0.5).astype(int)
  b = m.binary_metrics(y, p)
  np.testing.assert_allclose(b["auroc"], skm.roc_auc_score(y, p), rtol=1e-10)
  np.testing.assert_allclose(b["auprc"], skm.average_precision_score(y, p), rtol=1e-10)
  np.testing.assert_allclose(b["f1"], skm.f1_score(y, pred), rtol=1e-10)
  np.testing.assert_allclose(b["f1_macro"], skm.f1_score(y, pred, average="macro"), rtol=1e-10)
  np.testing.assert_allclose(b["jaccard"], skm.jaccard_score(y, pred), rtol=1e-10)
  yc = rng.integers(0, 10, 300)
  pc = rng.dirichlet(np.ones(10), 300)
  pc[np.arange(300), yc] += 0.2
  pc /= pc.sum(1, keepdims=True)
  c = m.multiclass_metrics(yc, pc)
  np.testing.assert_allclose(c["accuracy"], skm.accuracy_score(yc, pc.argmax(1)), rtol=1e-10)
  np.testing.assert_allclose(c["f1_macro"], skm.f1_score(yc, pc.argmax(1), average="macro"), rtol=1e-10)
  np.testing.assert_allclose(c["f1_weighted"], skm.f1_score(yc, pc.argmax(1), average="weighted"), rtol=1e-10)
  np.testing.assert_allclose(c["kappa"], skm.cohen_kappa_score(yc, pc.argmax(1)), rtol=1e-10)
  np.testing.assert_allclose(c["auroc"], skm.roc_auc_score(yc, pc, multi_class="ovr", average="weighted"), rtol=1e-10)
  yl = rng.integers(0, 2, (50, 12))
  yl[:, 0], yl[:, 1] = 1, 0  # every row has both classes (sklearn's sample AUROC needs it)
  pl = np.clip(rng.random((50, 12)) * 0.6 + 0.3 * yl, 0, 1)
  ml = m.multilabel_metrics(yl, pl)
  np.testing.assert_allclose(ml["jaccard"], skm.jaccard_score(yl, pl >= 0.5, average="samples", zero_division=1),
                             rtol=1e-10)
  np.testing.assert_allclose(ml["f1"], skm.f1_score(yl, pl >= 0.5, average="samples", zero_division=1), rtol=1e-10)
  np.testing.assert_allclose(ml["auprc"], skm.average_precision_score(yl, pl, average="samples"), rtol=1e-10)
  np.testing.assert_allclose(ml["auroc"], skm.roc_auc_score(yl, pl, average="samples"), rtol=1e-10)
  lo, hi = m.bootstrap_ci("binary", y, p, num_resamples=100, metrics=("auroc",))["auroc"]
  assert lo <= b["auroc"] <= hi


def test_task_loss_hand_values():
  logits = jnp.array([[0.0], [2.0], [5.0]])
  labels = jnp.array([1, 0, 1])
  mask = jnp.array([True, True, False])
  # BCE: [log 2, log(1 + e^2)] -> (0.693147 + 2.126928) / 2 = 1.410038 (third row masked)
  np.testing.assert_allclose(graphcare.task_loss(logits, labels, mask, "binary"), 1.410038, atol=1e-4)
  # CE over 2 classes with logits [0, 2], label 1 -> log(1 + e^-2) = 0.126928
  np.testing.assert_allclose(graphcare.task_loss(jnp.array([[0.0, 2.0]]), jnp.array([1]), jnp.array([True]),
                                                 "multiclass"), 0.126928, atol=1e-4)


# ------------------------------------------------------------------------------------------------ training


def test_train_step_lowers_loss_compiled_once(small_world):
  _, ckg, _, batcher = small_world
  batch = batcher.batch(np.arange(16))
  model = _bat(ckg)
  state = _init(model, batch, optax.adam(1e-2), ckg.node_embedding, ckg.relation_embedding)
  bound = graphcare.make_train_step(model, "binary")

  def step_fn(state, batch, key):
    return bound(state, batch, key)

  step = jax.jit(chex.assert_max_traces(step_fn, n=1))
  eval_loss = jax.jit(lambda p: graphcare.loss_fn(p, batch, jax.random.key(0), model=model, task="binary",
                                                  train=False)[0])
  loss0 = float(eval_loss(state.params))
  for _ in range(10):
    state, metrics = step(state, batch, jax.random.key(1))
  loss1 = float(eval_loss(state.params))
  assert int(state.step) == 10 and loss1 < 0.8 * loss0


def test_one_and_eight_devices_agree(small_world):
  _, ckg, _, batcher = small_world
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices")
  batch = batcher.batch(np.arange(16))
  model = _bat(ckg)
  state = _init(model, batch, optax.adam(1e-3))
  out = []
  for mesh in sharding.device_meshes((1, 8)):
    with jax.set_mesh(mesh):
      fn = jax.jit(lambda s, b: graphcare.loss_fn(s.params, b, jax.random.key(0), model=model, task="binary")[0],
                   in_shardings=(sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)))
      out.append(float(fn(state, sharding.shard_batch(batch, mesh))))
  np.testing.assert_allclose(out[0], out[1], rtol=1e-5)


def test_run_tiny_smoke(tmp_path):
  from iclr24_jax.configs import graphcare as cfg_mod
  from iclr24_jax.papers.graphcare import experiment
  cfg = cfg_mod.get_config("tiny")
  cfg.num_steps, cfg.checkpoint_every, cfg.model.num_layers = 6, 6, 1
  res = experiment.run(cfg, str(tmp_path))
  assert np.isfinite(res["test"]["auroc"]) and res["data"]["num_samples"] == 240
  saved = json.loads((tmp_path / "results.json").read_text())
  assert "test_ci95" in saved and (tmp_path / "metrics.jsonl").exists() and (tmp_path / "curves.png").exists()


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


def test_fit_seeds_seed_independent_and_chunk_equivalent(small_world):
  from iclr24_jax.papers.graphcare import train as train_lib
  _, ckg, _, batcher = small_world
  model = _bat(ckg)
  idx = np.arange(64)
  sample = batcher.batch(idx[:16])
  tx = optax.adam(1e-2)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  streams = {s: batcher.train_batches(idx, s) for s in (0, 1)}
  kw = dict(mesh=mesh, node_embedding=ckg.node_embedding, relation_embedding=ckg.relation_embedding, log_every=4)
  both = train_lib.fit_seeds(model, "binary", tx, sample, lambda s, t: streams[s](t), 4, (0, 1), steps_per_call=2,
                             **kw)
  one = train_lib.fit_seeds(model, "binary", tx, sample, lambda s, t: streams[s](t), 4, (1,), steps_per_call=1, **kw)
  # seed 1 trained beside seed 0 in 2-step scan chunks == seed 1 alone, step by step
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a[1], b[0], rtol=1e-5, atol=1e-6), both["params"],
               one["params"])
  leaves = jax.tree.leaves(both["params"])
  assert any(np.abs(l[0] - l[1]).max() > 1e-6 for l in leaves)     # different seeds, different params


def test_official_run_config():
  from iclr24_jax.configs import graphcare as cfg_mod
  c = cfg_mod.get_config("repro,official_run")
  assert c.model.match_official_code and not c.model.use_alpha and not c.model.use_beta
  assert cfg_mod.get_config("official_graph").data.graph_construction == "official"
  c = cfg_mod.get_config("gat_rel")
  assert c.model.name == "gat" and c.model.edge_types


# ------------------------------------------------------------------------------------------------ MIMIC-III demo


def test_mimic3_demo_tasks(shared_data):
  mv = data_lib.read_mimic3_demo(shared_data / "mimic3_demo")
  # visits are chronological per patient, across the 2199 -> 2200 wrap of the two-digit years
  for i in range(1, len(mv.subject)):
    if mv.subject[i] == mv.subject[i - 1]:
      assert mv.admit[i] >= mv.admit[i - 1]
  assert all(d >= a for a, d in zip(mv.admit, mv.discharge))
  assert [graphcare.categorize_los(d) for d in (0, 1, 7, 8, 14, 15)] == [0, 1, 7, 8, 8, 9]
  sizes = {}
  for task in ("mortality", "readmission", "los", "drugrec"):
    ds, raw = data_lib.mimic3_demo_task(task, mv=mv)
    sizes[task] = len(ds)
    assert len(ds.visits) == len(ds.labels) == len(ds.patient_ids)
    assert all(len(v) > 0 and all(len(x) > 0 for x in v) for v in ds.visits)
  assert sizes["los"] == sizes["drugrec"] and sizes["mortality"] == sizes["readmission"] < sizes["los"]
  ds, _ = data_lib.mimic3_demo_task("drugrec", mv=mv)
  assert ds.labels.ndim == 2 and ds.labels.shape[1] == ds.num_outputs


@pytest.mark.slow
def test_smollm2_hook_end_to_end():
  pytest.importorskip("gguf")
  try:
    fn = graphcare.smollm2_generate_fn(max_new_tokens=48, batch_size=2)
  except FileNotFoundError as e:
    pytest.skip(str(e))
  out = graphcare.propose_triples(fn, ["heart failure", "sepsis"], max_triples=5, batched=True)
  assert set(out) == {"heart failure", "sepsis"}
  assert all(len(t) == 3 and all(isinstance(x, str) and x for x in t) for ts in out.values() for t in ts)
  raw = graphcare.kg_from_triples(out)
  assert raw.concept_names == ["heart failure", "sepsis"]
