"""Graphs for PMP: the embedded multi-relation fraud generator, the YelpChi / Amazon / T-Finance `.mat` loaders,
the geom_gcn heterophilic graphs, label states, and padded full-graph batches.

All graphs are node-level: one node set shared by R relation graphs (edge lists sender -> receiver).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Sequence

import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import graph as graph_lib


@dataclasses.dataclass(frozen=True)
class GraphData:
  """A node-classification graph with several relations over one node set.

  Attributes:
    name: data set name.
    x: [N, F] float32 node features.
    labels: [N] int32 labels (0 benign / 1 fraud for fraud graphs).
    relations: R pairs (senders [E_r], receivers [E_r]) int32.
    relation_names: R names.
    train_idx, val_idx, test_idx: node indices of the splits.
    num_classes: C.
  """
  name: str
  x: np.ndarray
  labels: np.ndarray
  relations: tuple
  relation_names: tuple
  train_idx: np.ndarray
  val_idx: np.ndarray
  test_idx: np.ndarray
  num_classes: int = 2

  @property
  def num_nodes(self) -> int:
    return int(self.x.shape[0])

  @property
  def num_edges(self) -> int:
    return int(sum(len(s) for s, _ in self.relations))

  def label_state(self) -> np.ndarray:
    """[N] int32: the training label on training nodes, C (unknown) on every other node.

    Only training labels enter the partition; validation/test labels never do.
    """
    return label_state_from_split(self.labels, self.train_idx, self.num_classes)

  def describe(self) -> dict:
    """Sizes, class balance and per-relation, per-class homophily."""
    out = {"name": self.name, "nodes": self.num_nodes, "edges": self.num_edges, "features": int(self.x.shape[1]),
           "relations": list(self.relation_names), "num_classes": self.num_classes,
           "train": int(len(self.train_idx)), "val": int(len(self.val_idx)), "test": int(len(self.test_idx))}
    if self.num_classes == 2:
      labelled = np.concatenate([self.train_idx, self.val_idx, self.test_idx])
      out["fraud_ratio"] = float(np.mean(self.labels[labelled]))
    out["class_homophily"] = {n: [round(v, 4) for v in class_homophily(self.labels, s, r, self.num_classes)]
                              for n, (s, r) in zip(self.relation_names, self.relations)}
    out["edge_homophily"] = {n: round(edge_homophily(self.labels, s, r), 4)
                             for n, (s, r) in zip(self.relation_names, self.relations)}
    return out


def neighbour_label_counts(data: GraphData) -> np.ndarray:
  """Per relation, how many of a node's in-neighbours carry each training label state: [N, R * (C + 1)].

  Column r * (C + 1) + c counts the neighbours u -> v in relation r with label_state[u] == c (c = C: unknown,
  i.e. not a training node). Only training labels enter; a node never counts itself (graphs without
  self-loops). These are the features of the label-access control: GraphSAGE given the same training-label
  information PMP partitions by, as plain input features.

  Args:
    data: the graph.

  Returns:
    [N, R * (C + 1)] float32 counts.
  """
  state = data.label_state()
  k = data.num_classes + 1
  out = np.zeros((data.num_nodes, len(data.relations) * k), np.float32)
  for r, (s, d) in enumerate(data.relations):
    np.add.at(out, (np.asarray(d), r * k + state[np.asarray(s)]), 1.0)
  return out


def with_neighbour_labels(data: GraphData) -> GraphData:
  """The same graph with `neighbour_label_counts` appended to the node features: x [N, F + R * (C + 1)]."""
  x = np.concatenate([data.x, neighbour_label_counts(data)], axis=1).astype(np.float32)
  return dataclasses.replace(data, name=f"{data.name}+neighbour_labels", x=x)


def label_state_from_split(labels: np.ndarray, train_idx: np.ndarray, num_classes: int = 2) -> np.ndarray:
  """[N] int32 label state: labels[train_idx] on training nodes, `num_classes` (unknown) elsewhere.

  Args:
    labels: [N] int labels of all nodes (val/test labels are read only to be overwritten).
    train_idx: training node indices.
    num_classes: C; the unknown state is C.
  """
  labels = np.asarray(labels)
  state = np.full(labels.shape, num_classes, np.int32)
  state[train_idx] = labels[train_idx]
  return state


def class_homophily(labels: np.ndarray, senders: np.ndarray, receivers: np.ndarray, num_classes: int
                    ) -> list[float]:
  """Per-class homophily: for class c, the fraction of edges into class-c nodes whose sender is also class c.

  Returns:
    C floats (NaN for a class without incoming edges).
  """
  ys, yr = labels[senders], labels[receivers]
  out = []
  for c in range(num_classes):
    into = yr == c
    out.append(float(np.mean(ys[into] == c)) if into.any() else float("nan"))
  return out


def edge_homophily(labels: np.ndarray, senders: np.ndarray, receivers: np.ndarray) -> float:
  """Fraction of edges joining same-label nodes."""
  return float(np.mean(labels[senders] == labels[receivers])) if len(senders) else float("nan")


def row_normalize(x: np.ndarray) -> np.ndarray:
  """Official `row_normalize`: x / (row sum + 0.01), float32."""
  x = np.asarray(x, np.float64)
  return (x / (x.sum(1, keepdims=True) + 0.01)).astype(np.float32)


def _symmetrize(senders: np.ndarray, receivers: np.ndarray, num_nodes: int, drop_self_loops: bool = True
                ) -> tuple[np.ndarray, np.ndarray]:
  s = np.concatenate([senders, receivers]).astype(np.int64)
  r = np.concatenate([receivers, senders]).astype(np.int64)
  if drop_self_loops:
    keep = s != r
    s, r = s[keep], r[keep]
  key = np.unique(r * num_nodes + s)
  return (key % num_nodes).astype(np.int32), (key // num_nodes).astype(np.int32)


def stratified_split(labels: np.ndarray, train_size: float, val_size: float, seed: int,
                     candidates: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Stratified random split of `candidates` (default all nodes) into train / val / test (the rest)."""
  labels = np.asarray(labels)
  idx = np.arange(len(labels)) if candidates is None else np.asarray(candidates)
  rng = np.random.default_rng(seed)
  tr, va, te = [], [], []
  for c in np.unique(labels[idx]):
    members = rng.permutation(idx[labels[idx] == c])
    n_tr = int(round(train_size * len(members)))
    n_va = int(round(val_size * len(members)))
    tr.append(members[:n_tr])
    va.append(members[n_tr:n_tr + n_va])
    te.append(members[n_tr + n_va:])
  return tuple(np.sort(np.concatenate(p)).astype(np.int32) for p in (tr, va, te))


# ----------------------------------------------------------------------------------------------------------
# The embedded generator.


def make_fraud_graph(num_nodes: int = 4000, fraud_ratio: float = 0.1, num_relations: int = 3,
                     avg_degree: Sequence[float] = (6.0, 10.0, 14.0),
                     fraud_homophily: Sequence[float] = (0.3, 0.2, 0.1),
                     benign_fraud_rate: Sequence[float] = (0.02, 0.05, 0.08),
                     feature_dim: int = 32, class_shift: float = 0.15, feature_noise: float = 1.0,
                     fraud_degree_factor: float = 1.0, train_size: float = 0.4, val_size: float = 0.2,
                     seed: int = 0) -> GraphData:
  """A multi-relation, label-imbalanced, heterophilic fraud graph with contextual-SBM features.

  Nodes: a `fraud_ratio` share is fraud (label 1). Relation r: node v draws Poisson(avg_degree[r] / 2) (x
  `fraud_degree_factor` for fraud nodes) edge stubs; a fraud node sends a stub to a uniformly drawn fraud node
  with probability fraud_homophily[r] and to a benign node otherwise (camouflage: fraud links mostly to
  benign); a benign node picks a fraud node with probability benign_fraud_rate[r]. Edges are then made
  undirected (so measured homophily differs slightly from the targets; `GraphData.describe()` reports it).
  Features (contextual SBM): x_v = m + class_shift * y_v * u + feature_noise * eps, with a shared mean m
  (|m| = 1, so summed messages also carry neighbour counts), a random unit direction u, eps ~ N(0, I / F).
  Split: stratified train / val / test = train_size / val_size / rest (official 40 / 20 / 40).

  Args:
    num_nodes: N.
    fraud_ratio: share of fraud nodes (5-15% in the fraud benchmarks).
    num_relations: R; the per-relation sequences must have at least R entries.
    avg_degree, fraud_homophily, benign_fraud_rate: per-relation targets (see above).
    feature_dim: F.
    class_shift: separation of the class means along u, in units of the per-dimension noise * sqrt(F).
    feature_noise: noise scale.
    fraud_degree_factor: > 1 makes fraudsters more active.
    train_size, val_size: split fractions.
    seed: generator seed.

  Returns:
    GraphData named 'synthetic'.
  """
  if not 0.0 < fraud_ratio < 0.5:
    raise ValueError(f"fraud_ratio must lie in (0, 0.5) for a fraud graph; got {fraud_ratio}.")
  for name, seq in (("avg_degree", avg_degree), ("fraud_homophily", fraud_homophily),
                    ("benign_fraud_rate", benign_fraud_rate)):
    if len(seq) < num_relations:
      raise ValueError(f"{name} has {len(seq)} entries but num_relations={num_relations}; give one per relation.")
  rng = np.random.default_rng(seed)
  n = int(num_nodes)
  n_fraud = max(2, int(round(fraud_ratio * n)))
  labels = np.zeros(n, np.int32)
  labels[rng.choice(n, n_fraud, replace=False)] = 1
  fraud_ids, benign_ids = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
  relations, names = [], []
  for r in range(num_relations):
    lam = np.where(labels == 1, avg_degree[r] / 2.0 * fraud_degree_factor, avg_degree[r] / 2.0)
    stubs = rng.poisson(lam)
    src = np.repeat(np.arange(n), stubs)
    p_fraud = np.where(labels[src] == 1, fraud_homophily[r], benign_fraud_rate[r])
    to_fraud = rng.random(src.size) < p_fraud
    dst = np.where(to_fraud, fraud_ids[rng.integers(0, fraud_ids.size, src.size)],
                   benign_ids[rng.integers(0, benign_ids.size, src.size)])
    s, d = _symmetrize(src, dst, n)
    relations.append((s, d))
    names.append(f"rel{r}")
  u = rng.normal(size=feature_dim)
  u /= np.linalg.norm(u)
  m = rng.normal(size=feature_dim)
  m /= np.linalg.norm(m)
  x = m + class_shift * labels[:, None] * u + feature_noise * rng.normal(size=(n, feature_dim)) / np.sqrt(feature_dim)
  tr, va, te = stratified_split(labels, train_size, val_size, seed)
  return GraphData("synthetic", x.astype(np.float32), labels, tuple(relations), tuple(names), tr, va, te, 2)


# ----------------------------------------------------------------------------------------------------------
# The paper's fraud data sets (user files).

FRAUD_FILES = {
    "yelpchi": ("YelpChi.mat", ("net_rsr", "net_rtr", "net_rur")),
    "amazon": ("Amazon.mat", ("net_upu", "net_usu", "net_uvu")),
    "tfinance": ("tfinance.mat", ("homo",)),
}
FRAUD_SOURCES = """\
YelpChi.mat and Amazon.mat: the CARE-GNN release (github.com/YingtongDou/CARE-GNN, data/YelpChi.zip and
data/Amazon.zip), the same files DGL's FraudDataset downloads. T-Finance: the BWGNN release (github.com/squareRoot3/
Rethinking-Anomaly-Detection) ships a DGL binary graph `tfinance`; convert it once where DGL is installed:
  g = dgl.load_graphs('tfinance')[0][0]; s, d = g.edges()
  scipy.io.savemat('tfinance.mat', {'features': g.ndata['feature'].numpy(), 'label': g.ndata['label'].numpy(),
                                    'homo': scipy.sparse.coo_matrix((np.ones(len(s)), (s.numpy(), d.numpy())))})"""


def _find_file(data_dir: str | os.PathLike, filename: str) -> pathlib.Path:
  p = data_lib.resolve_data_dir(data_dir, "data_dir")
  if p.is_file():
    return p
  for cand in (p / filename, p / filename.lower(), p / pathlib.Path(filename).with_suffix(".npz").name):
    if cand.exists():
      return cand
  raise FileNotFoundError(f"'{filename}' not found in {p}; put it there (or point config.data.data_dir at the file).\n"
                          + FRAUD_SOURCES)


def _dgl_random_split(num_nodes: int, seed: int, train_size: float, val_size: float, start: int = 0):
  """DGL FraudDataset._random_split (official split for YelpChi / Amazon): permutation with RandomState(seed)."""
  index = np.random.RandomState(seed).permutation(np.arange(start, num_nodes))
  n_tr, n_va = int(train_size * len(index)), int(val_size * len(index))
  tr, va, te = index[:n_tr], index[len(index) - n_va:], index[n_tr:len(index) - n_va]
  return tuple(np.sort(v).astype(np.int32) for v in (tr, va, te))


def _tfinance_split(labels: np.ndarray, train_size: float):
  """Official T-Finance split: sklearn train_test_split, stratified, random_state=2; rest 33/67 val/test."""
  from sklearn.model_selection import train_test_split
  index = np.arange(len(labels))
  tr, rest, _, y_rest = train_test_split(index, labels, stratify=labels, train_size=train_size, random_state=2,
                                         shuffle=True)
  va, te, _, _ = train_test_split(rest, y_rest, stratify=y_rest, test_size=0.67, random_state=2, shuffle=True)
  return tuple(np.sort(v).astype(np.int32) for v in (tr, va, te))


def load_fraud_mat(name: str, data_dir: str | os.PathLike, homo: bool | None = None, train_size: float = 0.4,
                   val_size: float = 0.2, seed: int = 717, norm_feat: bool = True,
                   drop_self_loops: bool = True) -> GraphData:
  """Reads YelpChi / Amazon / T-Finance from the user's `.mat` file (scipy.io), official preprocessing.

  Args:
    name: 'yelpchi', 'amazon' or 'tfinance'.
    data_dir: folder holding YelpChi.mat / Amazon.mat / tfinance.mat (or .npz with the same keys), or the file.
    homo: merge the relations into one graph. None (default) = what the official run trains: the relations as
      they are for YelpChi and Amazon (three relations each), T-Finance's single relation. The official
      config/amazon.yml sets `homo: true`, but the official data path never reads the flag for Amazon, so the
      three-relation graph is what trains and what the paper's Amazon number comes from. True merges the
      relations into one graph (duplicates kept, like dgl.to_homogeneous).
    train_size, val_size: official 0.4 / 0.2.
    seed: DGL's split seed (official dataset_seed 717; T-Finance uses its own random_state=2 split).
    norm_feat: official row normalisation x / (row sum + 0.01).
    drop_self_loops: Deviation: self-loops are removed so a training node never sees its own label.

  Returns:
    GraphData (Amazon's first 3,305 unlabelled nodes stay in the graph but in no split).
  """
  import scipy.io
  import scipy.sparse as sp
  if name not in FRAUD_FILES:
    raise ValueError(f"unknown fraud data set '{name}'; choose one of {sorted(FRAUD_FILES)}.")
  filename, rel_keys = FRAUD_FILES[name]
  path = _find_file(data_dir, filename)
  raw = dict(np.load(path, allow_pickle=False)) if path.suffix == ".npz" else scipy.io.loadmat(str(path))
  missing = [k for k in ("features", "label") + rel_keys if k not in raw]
  if missing:
    raise ValueError(f"{path} lacks {missing}; expected keys 'features', 'label' and {list(rel_keys)}.")
  feats = raw["features"]
  x = np.asarray(feats.todense() if sp.issparse(feats) else feats, np.float64)
  y = np.asarray(raw["label"])
  y = (y.argmax(1) if y.ndim == 2 and y.shape[1] == 2 and y.shape[0] == x.shape[0] else y.ravel()).astype(np.int32)
  n = x.shape[0]
  rels, names = [], []
  for k in rel_keys:
    adj = sp.coo_matrix(raw[k])
    s, r = adj.row.astype(np.int32), adj.col.astype(np.int32)   # DGL: (row, col) = (src, dst)
    if drop_self_loops:
      keep = s != r
      s, r = s[keep], r[keep]
    rels.append((s, r))
    names.append(k)
  homo = False if homo is None else homo   # the official run: the flag is not read (see Args)
  if homo and len(rels) > 1:
    rels = [(np.concatenate([s for s, _ in rels]), np.concatenate([r for _, r in rels]))]
    names = ["homo"]
  if name == "tfinance":
    tr, va, te = _tfinance_split(y, train_size)
  else:
    tr, va, te = _dgl_random_split(n, seed, train_size, val_size, start=3305 if name == "amazon" else 0)
  x = row_normalize(x) if norm_feat else x.astype(np.float32)
  return GraphData(name, x, y, tuple(rels), tuple(names), tr, va, te, 2)


# ----------------------------------------------------------------------------------------------------------
# geom_gcn heterophilic graphs (shared data).

GEOM_GCN = ("texas", "cornell", "wisconsin", "film")


def load_geom_gcn(name: str, root: str | os.PathLike | None = None, train_size: float = 0.6, val_size: float = 0.2,
                  seed: int = 0) -> GraphData:
  """A geom_gcn graph (texas, cornell, wisconsin, film) as a 5-class, one-relation GraphData.

  Edges are made undirected, deduplicated, self-loops dropped; features row-normalised (film's feature-index
  lists become multi-hot vectors). The split is a stratified random 60/20/20 (Geom-GCN's proportions; its
  fixed split files are not in the shared data) drawn from `seed`.

  Args:
    name: one of GEOM_GCN.
    root: the geom_gcn folder (default: shared_data_dir()/geom_gcn).
    train_size, val_size: split fractions.
    seed: split seed.
  """
  if name not in GEOM_GCN:
    raise ValueError(f"unknown geom_gcn graph '{name}'; choose one of {GEOM_GCN}.")
  if root is None:
    shared = data_lib.shared_data_dir(required=True)
    root = shared / "geom_gcn"
  folder = data_lib.resolve_data_dir(pathlib.Path(root) / name, "geom_gcn folder")
  ids, feats, labels = [], [], []
  with open(folder / "out1_node_feature_label.txt") as f:
    header = f.readline()
    for line in f:
      i, feat, lab = line.rstrip("\n").split("\t")
      ids.append(int(i))
      feats.append([int(v) for v in feat.split(",")] if feat else [])
      labels.append(int(lab))
  n = len(ids)
  order = np.argsort(ids)
  if not np.array_equal(np.asarray(ids)[order], np.arange(n)):
    raise ValueError(f"{folder}: node ids are not 0..{n - 1}.")
  if "feature_amount" in header:   # film: lists of active feature indices
    dim = int(header.split("feature_amount:")[1].split(")")[0])
    dim = max(dim, 1 + max((max(f) for f in feats if f), default=0))
    x = np.zeros((n, dim), np.float32)
    for i, f in zip(ids, feats):
      x[i, f] = 1.0
  else:
    x = np.zeros((n, len(feats[0])), np.float32)
    for i, f in zip(ids, feats):
      x[i] = f
  y = np.zeros(n, np.int32)
  y[np.asarray(ids)] = labels
  e = np.loadtxt(folder / "out1_graph_edges.txt", dtype=np.int64, skiprows=1).reshape(-1, 2)
  s, r = _symmetrize(e[:, 0], e[:, 1], n)
  num_classes = int(y.max()) + 1
  tr, va, te = stratified_split(y, train_size, val_size, seed)
  return GraphData(name, row_normalize(x), y, ((s, r),), ("edges",), tr, va, te, num_classes)


# ----------------------------------------------------------------------------------------------------------
# Padded full-graph batches.


def bucket_budget(n: int, multiple: int = 64, fraction_bits: int = 4) -> int:
  """A padding budget >= n: a multiple of `multiple` and of 2^(floor(log2 n) - fraction_bits), so padding is
  at most ~1/16 and graphs of similar size (seeds of a generator) share one compiled shape."""
  q = multiple
  if n > 0:
    q = multiple * max(1, (2 ** max(int(np.floor(np.log2(n))) - fraction_bits, 0)) // multiple)
  return graph_lib.round_budget(n, q)


def make_batch(data: GraphData, node_multiple: int = 64, edge_multiple: int = 64) -> tuple[dict, dict]:
  """The whole graph as one fixed-shape batch, padded through common.graph (jraph.pad_with_graphs).

  Every leaf has a leading node or edge axis (so `shard_batch` can split it over the mesh's 'data' axis).

  Args:
    data: the graph.
    node_multiple, edge_multiple: budgets are multiples of these (keep them multiples of the device count);
      see bucket_budget.

  Returns:
    (batch, info): batch = {'x' [Np, F], 'labels' [Np], 'label_state' [Np], 'train_mask' [Np] float32,
    'val_mask', 'test_mask', 'node_mask' [Np], 'relations': [{'senders' [Ep_r], 'receivers' [Ep_r]}] * R};
    info = {'num_nodes', 'node_budget', 'edge_budgets'}.
  """
  n = data.num_nodes
  n_budget = bucket_budget(n + 1, node_multiple)

  def split_mask(idx):
    m = np.zeros(n, np.float32)
    m[idx] = 1.0
    return m

  nodes = {"x": data.x.astype(np.float32), "labels": data.labels.astype(np.int32),
           "label_state": data.label_state(), "train_mask": split_mask(data.train_idx),
           "val_mask": split_mask(data.val_idx), "test_mask": split_mask(data.test_idx)}
  rels, budgets, padded_nodes = [], [], None
  for s, r in data.relations:
    g = graph_lib.graph_from_edges(s, r, n, nodes=nodes)
    e_budget = bucket_budget(len(s), edge_multiple)
    gp = graph_lib.pad_to_budget(g, n_node=n_budget, n_edge=e_budget, n_graph=2)
    rels.append({"senders": np.asarray(gp.senders, np.int32), "receivers": np.asarray(gp.receivers, np.int32)})
    budgets.append(e_budget)
    if padded_nodes is None:
      padded_nodes = {k: np.asarray(v) for k, v in gp.nodes.items()}
      padded_nodes["node_mask"] = np.asarray(graph_lib.node_mask(gp))
  # Padding nodes are 'unknown' (they only ever receive padding edges anyway).
  padded_nodes["label_state"] = np.where(padded_nodes["node_mask"], padded_nodes["label_state"],
                                         data.num_classes).astype(np.int32)
  batch = dict(padded_nodes, relations=rels)
  return batch, {"num_nodes": n, "node_budget": n_budget, "edge_budgets": budgets}


def batch_graphs(batch: dict) -> list:
  """The relation GraphsTuples of a batch (inside jit: senders/receivers only, no node payload)."""
  out = []
  for rel in batch["relations"]:
    out.append(graph_lib.GraphsTuple(nodes=None, edges=None, senders=rel["senders"], receivers=rel["receivers"],
                                     n_node=None, n_edge=None, globals=None))
  return out


# ----------------------------------------------------------------------------------------------------------
# One entry point for the paper's data sets.

DATASETS = {
    "yelpchi": "YelpChi.mat (CARE-GNN release): features [45,954 x 32] sparse, label [1 x N], relations net_rur, "
               "net_rtr, net_rsr (+ homo) as sparse adjacency; split 40/20/40 by DGL's RandomState(717) permutation",
    "amazon": "Amazon.mat (CARE-GNN release): features [11,944 x 25], label, relations net_upu, net_usu, net_uvu; "
              "the first 3,305 (unlabelled) nodes are in no split",
    "tfinance": "tfinance.mat converted from the BWGNN DGL graph: features, label, homo (one relation); stratified "
                "split with random_state 2",
    "texas": "geom_gcn new_data/texas (out1_node_feature_label.txt, out1_graph_edges.txt)",
    "cornell": "geom_gcn new_data/cornell",
    "wisconsin": "geom_gcn new_data/wisconsin",
    "film": "geom_gcn new_data/film",
}


def load(data_config) -> GraphData:
  """The graph `config.data` names, read from `config.data.data_dir` (or `$ICLR24_DATA`).

  Args:
    data_config: config.data with `name` (a key of DATASETS), `data_dir`, and optionally train_size, val_size,
      split_seed, homo (-1 / 0 / 1: the official default, split relations, merged relations).

  Returns:
    GraphData with the official preprocessing (row-normalised features, official split).

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: the file is not there (the message says where to
      get it). common.data.DataFormatError: the .mat lacks the CARE-GNN keys.
  """
  name = data_lib.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown PMP data set '{name}'; choose one of {sorted(DATASETS)}.")
  get = lambda k, d: data_lib.config_value(data_config, k, d)
  if name in GEOM_GCN:
    root = data_lib.locate_data(data_config, "geom_gcn", what=f"geom_gcn '{name}'",
                                layout=f"{name}/out1_node_feature_label.txt and {name}/out1_graph_edges.txt",
                                source="github.com/graphdml-uiuc-jlu/geom-gcn, folder new_data/")
    return load_geom_gcn(name, root=root, train_size=get("train_size", 0.6), val_size=get("val_size", 0.2),
                         seed=int(get("split_seed", 0)))
  filename, keys = FRAUD_FILES[name]
  if not get("data_dir", ""):
    raise data_lib.DataNotFoundError(f"PMP '{name}' is read from a user's file: set config.data.data_dir to the "
                                     f"folder holding {filename} (keys 'features', 'label', {list(keys)}).\n"
                                     + FRAUD_SOURCES)
  homo = int(get("homo", -1))
  try:
    return load_fraud_mat(name, get("data_dir", ""), homo=None if homo < 0 else bool(homo),
                          train_size=get("train_size", 0.4), val_size=get("val_size", 0.2),
                          seed=int(get("split_seed", 717)))
  except FileNotFoundError as e:
    raise data_lib.DataNotFoundError(str(e)) from e
  except ValueError as e:
    if "lacks" in str(e):
      raise data_lib.DataFormatError(str(e)) from e
    raise
