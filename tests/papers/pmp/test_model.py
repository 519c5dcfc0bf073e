"""PMP (Zhuo et al., ICLR 2024): layer algebra, padding / label-leak invariances, metrics vs scikit-learn,
train step, 1 vs 8 devices, the loaders, and a smoke run of the tiny experiment."""
import functools
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn import metrics as skm

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers import pmp
from iclr24_jax.papers.pmp import data as data_lib
from iclr24_jax.papers.pmp import metrics as pmp_metrics
from iclr24_jax.papers.pmp import train as train_lib


# Compiled once per static setting (eager calls would compile every primitive separately).
_partition = jax.jit(pmp.partition_messages, static_argnames=("num_classes", "aggregation", "activation"))
_sage = jax.jit(pmp.sage_messages, static_argnames=("aggregation", "activation"))
_init_params = jax.jit(pmp.init_params, static_argnums=(1, 2, 3))


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
def tiny_graph():
  return pmp.make_fraud_graph(num_nodes=200, feature_dim=8, avg_degree=(4.0, 6.0, 8.0), fraud_ratio=0.15, seed=3)


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
# Metrics against scikit-learn.


def _fixed_predictions():
  rng = np.random.default_rng(0)
  labels = (rng.random(500) < 0.12).astype(np.int32)
  scores = np.round(np.clip(0.3 * labels + rng.normal(0.3, 0.2, 500), 0, 1), 2).astype(np.float32)  # with ties
  return scores, labels


def test_metrics_equal_sklearn():
  scores, labels = _fixed_predictions()
  thr = 0.45
  preds = (scores >= thr).astype(int)
  got = pmp.evaluate(jnp.asarray(scores), jnp.asarray(labels), threshold=thr)
  assert set(got) == {"auc", "f1_macro", "gmean"}
  np.testing.assert_allclose(float(got["auc"]), skm.roc_auc_score(labels, scores), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(got["f1_macro"]), skm.f1_score(labels, preds, average="macro"), rtol=1e-5,
                             atol=1e-6)
  tn, fp, fn, tp = skm.confusion_matrix(labels, preds).ravel()
  np.testing.assert_allclose(float(got["gmean"]), np.sqrt(tp * tn / ((tp + fn) * (tn + fp))), rtol=1e-5, atol=1e-6)
  # A mask equals evaluating the selected entries only (inside jit too).
  mask = np.random.default_rng(1).random(500) < 0.5
  masked = jax.jit(pmp.evaluate)(jnp.asarray(scores), jnp.asarray(labels), jnp.asarray(mask), thr)
  np.testing.assert_allclose(float(masked["auc"]), skm.roc_auc_score(labels[mask], scores[mask]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(masked["f1_macro"]),
                             skm.f1_score(labels[mask], preds[mask], average="macro"), rtol=1e-5, atol=1e-6)


def test_best_f1_threshold_matches_official_rule():
  scores, labels = _fixed_predictions()
  precision, recall, thresholds = skm.precision_recall_curve(labels, scores)
  with np.errstate(invalid="ignore", divide="ignore"):
    f1 = np.nan_to_num(2 * precision * recall / (precision + recall))
  want = thresholds[np.argmax(f1)]
  assert pmp.best_f1_threshold(scores, labels) == pytest.approx(float(want))
  with pytest.raises(ValueError, match="no positive"):
    pmp.best_f1_threshold(scores, np.zeros_like(labels))


def test_multiclass_auc_equals_sklearn_ovr():
  rng = np.random.default_rng(2)
  labels = rng.integers(0, 4, 300)
  probs = jax.nn.softmax(jnp.asarray(rng.normal(size=(300, 4)) + 0.8 * np.eye(4)[labels]), -1)
  np.testing.assert_allclose(pmp_metrics.multiclass_auc(np.asarray(probs), labels),
                             skm.roc_auc_score(labels, np.asarray(probs, np.float64), multi_class="ovr"), rtol=1e-5)
  np.testing.assert_allclose(pmp_metrics.multiclass_f1_macro(np.asarray(probs), labels),
                             skm.f1_score(labels, np.argmax(probs, -1), average="macro"), rtol=1e-6)


# --------------------------------------------------------------------------------------------------------
# Training.


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


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """The tiny experiment, run once (default mesh: all 8 simulated devices)."""
  from iclr24_jax.configs import pmp as cfg_mod
  from iclr24_jax.papers.pmp import experiment
  cfg = cfg_mod.get_config("tiny")
  workdir = tmp_path_factory.mktemp("pmp_tiny")
  return cfg, workdir, experiment.run(cfg, str(workdir))


def test_tiny_experiment_smoke(tiny_run):
  _, workdir, res = tiny_run
  for f in ("results.json", "metrics.jsonl", "val_curves.png", "test_scores.png"):
    assert os.path.exists(workdir / f), f
  saved = json.load(open(workdir / "results.json"))
  assert set(saved["baselines"]) == {"sage", "gcn"}
  for k in ("auc", "f1_macro", "gmean"):
    assert 0.0 <= res["test"][k] <= 1.0
  assert res["data"]["nodes"] == 300


def test_one_and_eight_devices_agree(tiny_run):
  from iclr24_jax.common.metrics import read_jsonl
  from iclr24_jax.papers.pmp import experiment
  cfg, workdir, res8 = tiny_run
  data = experiment.load_graph(cfg.data, seed=cfg.seed)
  res1 = train_lib.fit(cfg, data, mesh=sharding.make_mesh(devices=jax.devices()[:1]))
  l1 = [r["train/loss"] for r in res1["history"] if "train/loss" in r]
  l8 = [r["train/loss"] for r in read_jsonl(str(workdir / "metrics.jsonl")) if "train/loss" in r]
  assert len(l1) == len(l8) == cfg.num_steps // cfg.log_every
  np.testing.assert_allclose(l1, l8, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(res1["test"]["auc"], res8["test"]["auc"], atol=1e-4)


# --------------------------------------------------------------------------------------------------------
# Data.


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
