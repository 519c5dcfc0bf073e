"""Personalised patient KGs (paper Sec. 3.2) as padded jraph batches, and the visit x node matrix.

A patient's KG is the union of the concept KGs of every code in every visit. Its nodes are global KG
node ids (clusters); its edges are the union of those concept triples, added in both directions with
the triple's relation id. The visit x node matrix says which of the patient's nodes belong to which
visit (the nodes of the concept KGs of that visit's codes). The official code keeps it as a dense
multi-hot [V, M] over all M KG nodes per patient (`visit_padded_node`); here it is stored per node of
the flat jraph layout, [N, V] (row n = node n of the batch, column j = visit j, chronological, padded at
the end), which is the official matrix restricted to the patient's own nodes and transposed - the only
entries the official forward ever reads.

The node-level attention needs, for every node k, sum_l W_alpha[id_l, id_k] over the nodes l of each
visit of the same patient; batches therefore also carry the within-patient node pairs (l, k) (all n_g^2
of them per patient, padded to a budget), so the cost is sum_g n_g^2 instead of the official B V M^2.

Batches for a device mesh are stacks of S equal-budget shards ([S, ...] leaves), so the leading axis
shards over 'data' and every shard holds whole graphs.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.common.graph import jraph
from iclr24_jax.papers.graphcare.kg import ConceptKG


@dataclasses.dataclass(frozen=True)
class PatientGraph:
  """One patient's KG (host numpy arrays, local node indices).

  Attributes:
    node_ids: [n] int32 global node ids (sorted).
    ehr: [n] bool, True for direct EHR nodes (the concept nodes of the patient's codes).
    senders, receivers: [e] int32 local indices (each triple in both directions).
    relation: [e] int32 relation ids.
    visit_node: [J, n] uint8, node k belongs to visit j (J real visits, chronological).
    codes: J arrays of the visit's concept node ids (for the EHR-only baseline).
  """

  node_ids: np.ndarray
  ehr: np.ndarray
  senders: np.ndarray
  receivers: np.ndarray
  relation: np.ndarray
  visit_node: np.ndarray
  codes: list[np.ndarray]

  @property
  def num_nodes(self) -> int:
    return int(self.node_ids.shape[0])

  @property
  def num_edges(self) -> int:
    return int(self.senders.shape[0])

  @property
  def num_visits(self) -> int:
    return int(self.visit_node.shape[0])


CONSTRUCTIONS = ("paper", "official")


def global_triples(concept_kg: ConceptKG) -> np.ndarray:
  """The official code's global KG: every concept triple in one simple graph, ONE relation per node pair.

  The official pipeline merges all concept KGs into one networkx graph (`nx.Graph`, undirected, no parallel
  edges) and converts it to one torch_geometric graph; adding a triple on an existing pair overwrites its
  relation, so the last triple written (concept order, then triple order) wins.

  Args:
    concept_kg: the clustered concept KGs.

  Returns:
    [T, 3] int64 (head, relation, tail) with one row per unordered node pair, sorted by (min, max) node.
  """
  trip = [t for t in concept_kg.concept_triples if len(t)]
  if not trip:
    return np.zeros((0, 3), np.int64)
  allt = np.concatenate(trip, 0).astype(np.int64)
  lo, hi = np.minimum(allt[:, 0], allt[:, 2]), np.maximum(allt[:, 0], allt[:, 2])
  pair = lo * (concept_kg.num_nodes + 1) + hi
  # the LAST occurrence of each pair: unique over the reversed array gives first-in-reverse = last
  _, idx_rev = np.unique(pair[::-1], return_index=True)
  last = len(pair) - 1 - idx_rev
  return allt[np.sort(last)][np.argsort(pair[np.sort(last)], kind="stable")]


def patient_graph(visits: Sequence[Sequence[int]], concept_kg: ConceptKG, max_visits: int | None = None,
                  construction: str = "paper", global_kg: np.ndarray | None = None) -> PatientGraph:
  """Composes one patient's KG from the concept KGs of its codes (paper Sec. 3.2).

  Two constructions with the same node set (every node of the concept KGs of the patient's codes):
    'paper': the edges are the union of those concept KGs' triples (Eq. in Sec. 3.2: G_pat = union of G_e).
    'official': the patient's nodes cut out of ONE global graph (official `get_subgraph`: the subgraph of the
      global torch_geometric graph induced by `patient['node_set']`): every global edge between two of the
      patient's nodes, also edges that come from another concept's KG, with one relation per node pair
      (`global_triples`). Deviation: the official `get_subgraph` first calls `G.edge_subgraph(node_set)`,
      which selects EDGE indices equal to the node ids; that quirk is not reproduced (the induced subgraph is).

  Args:
    visits: J visits (chronological), each a sequence of concept indices into `concept_kg`.
    concept_kg: the clustered concept KGs.
    max_visits: keep only the most recent this many visits (None: all).
    construction: 'paper' or 'official'.
    global_kg: [T, 3] `global_triples(concept_kg)` (computed when None; pass it when building many graphs).

  Returns:
    PatientGraph.
  """
  if construction not in CONSTRUCTIONS:
    raise ValueError(f"patient_graph: unknown construction '{construction}'; choose one of {CONSTRUCTIONS}.")
  if len(visits) == 0:
    raise ValueError("patient_graph: a patient needs at least one visit.")
  if max_visits is not None and len(visits) > max_visits:
    visits = visits[-max_visits:]
  c = concept_kg.num_concepts
  visit_nodes, triples, codes = [], [], []
  for j, visit in enumerate(visits):
    v = np.asarray(visit, np.int64).reshape(-1)
    if v.size == 0:
      raise ValueError(f"patient_graph: visit {j} has no codes; drop empty visits before building graphs.")
    if v.min() < 0 or v.max() >= c:
      raise ValueError(f"patient_graph: visit {j} has concept ids outside [0, {c}); map codes with the same KG.")
    nodes = [concept_kg.concept_nodes(int(code)) for code in v]
    visit_nodes.append(np.unique(np.concatenate(nodes)))
    triples.extend(concept_kg.concept_triples[int(code)] for code in v)
    codes.append(np.unique(concept_kg.concept_node[v]).astype(np.int32))
  node_ids = np.unique(np.concatenate(visit_nodes))
  if construction == "official":
    g = global_triples(concept_kg) if global_kg is None else np.asarray(global_kg, np.int64)
    keep = np.isin(g[:, 0], node_ids) & np.isin(g[:, 2], node_ids)
    trip = g[keep]
  else:
    trip = np.unique(np.concatenate(triples, 0), axis=0) if triples else np.zeros((0, 3), np.int64)
  heads = np.searchsorted(node_ids, trip[:, 0])
  tails = np.searchsorted(node_ids, trip[:, 2])
  senders = np.concatenate([heads, tails]).astype(np.int32)
  receivers = np.concatenate([tails, heads]).astype(np.int32)
  relation = np.concatenate([trip[:, 1], trip[:, 1]]).astype(np.int32)
  order = np.lexsort((senders, receivers))
  vn = np.zeros((len(visits), len(node_ids)), np.uint8)
  for j, nodes in enumerate(visit_nodes):
    vn[j, np.searchsorted(node_ids, nodes)] = 1
  ehr = np.isin(node_ids, np.concatenate(codes))
  return PatientGraph(node_ids=node_ids.astype(np.int32), ehr=ehr, senders=senders[order], receivers=receivers[order],
                      relation=relation[order], visit_node=vn, codes=codes)


@dataclasses.dataclass(frozen=True)
class Budgets:
  """Static shapes of one shard: graphs (real, without the padding graph), nodes, edges, visits,
  within-patient node pairs, codes per visit."""

  graphs: int
  nodes: int
  edges: int
  visits: int
  pairs: int
  codes_per_visit: int


def budgets_for(graphs: Sequence[PatientGraph], graphs_per_shard: int, multiple: int = 8) -> Budgets:
  """Budgets that fit ANY `graphs_per_shard` of `graphs` (the sum of the largest ones), so one compiled
  step serves every batch.

  Args:
    graphs: all patient graphs that will be batched.
    graphs_per_shard: real graphs per shard.
    multiple: round node / edge / per-graph budgets up to a multiple of this.

  Returns:
    Budgets.
  """
  if not graphs:
    raise ValueError("budgets_for: no patient graphs given.")
  g = int(graphs_per_shard)
  sizes = np.asarray([pg.num_nodes for pg in graphs], np.int64)
  nodes = np.sort(sizes)[::-1][:g].sum() + 1
  edges = np.sort([pg.num_edges for pg in graphs])[::-1][:g].sum()
  pairs = np.sort(sizes ** 2)[::-1][:g].sum()
  up = lambda n: int(-(-int(n) // multiple) * multiple)
  return Budgets(graphs=g, nodes=up(nodes), edges=up(max(edges, 1)), visits=max(pg.num_visits for pg in graphs),
                 pairs=up(max(pairs, 1)), codes_per_visit=max(max(len(c) for c in pg.codes) for pg in graphs))


def collate(graphs: Sequence[PatientGraph | None], budgets: Budgets) -> dict:
  """Concatenates patient graphs into one padded shard.

  `None` entries are empty filler graphs (no nodes) with valid=False, used to fill a last batch.

  Args:
    graphs: at most budgets.graphs patient graphs (or None).
    budgets: the static shapes.

  Returns:
    dict with
      graph: GraphsTuple padded with common.graph.pad_to_budget to (budgets.nodes, budgets.edges,
        budgets.graphs + 1 graphs); nodes {'id' [N] int32, 'ehr' [N] bool}, edges {'relation' [E] int32},
        globals {'num_visits' [G] int32}; edges sorted by receiver.
      visit_node: [N, V] float32, node n belongs to visit j of its patient.
      pairs: [P, 2] int32 (l, k) flat indices of every ordered node pair of the same patient, sorted by k
        (padding pairs point at the padding node, which only talks to itself).
      codes: [G, V, K] int32 concept node ids per visit (-1 padded).
      valid: [G] bool, real patients (False on fillers and the padding graph).
  """
  b = budgets
  if len(graphs) > b.graphs:
    raise ValueError(f"collate: {len(graphs)} graphs for a shard budget of {b.graphs}.")
  graphs = list(graphs) + [None] * (b.graphs - len(graphs))
  ids, ehr, snd, rcv, rel, n_node, n_edge, n_vis, vns, pin, pout = [], [], [], [], [], [], [], [], [], [], []
  codes = np.full((b.graphs + 1, b.visits, b.codes_per_visit), -1, np.int32)
  valid = np.zeros((b.graphs + 1,), bool)
  offset = 0
  for g, pg in enumerate(graphs):
    if pg is None:
      n_node.append(0), n_edge.append(0), n_vis.append(0)
      continue
    if pg.num_visits > b.visits:
      raise ValueError(f"collate: a patient with {pg.num_visits} visits exceeds the budget of {b.visits} visits; "
                       "recompute budgets_for (or cap max_visits).")
    n = pg.num_nodes
    ids.append(pg.node_ids), ehr.append(pg.ehr)
    snd.append(pg.senders + offset), rcv.append(pg.receivers + offset), rel.append(pg.relation)
    n_node.append(n), n_edge.append(pg.num_edges), n_vis.append(pg.num_visits)
    vn = np.zeros((n, b.visits), np.float32)
    vn[:, : pg.num_visits] = pg.visit_node.T
    vns.append(vn)
    pin.append(offset + np.tile(np.arange(n), n)), pout.append(offset + np.repeat(np.arange(n), n))  # sorted by k
    for j, c in enumerate(pg.codes):
      codes[g, j, : len(c)] = c
    valid[g] = True
    offset += n
  cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros((0,), dt)
  graph = jraph.GraphsTuple(nodes={"id": cat(ids, np.int32), "ehr": cat(ehr, bool)},
                            edges={"relation": cat(rel, np.int32)}, senders=cat(snd, np.int32),
                            receivers=cat(rcv, np.int32), n_node=np.asarray(n_node, np.int32),
                            n_edge=np.asarray(n_edge, np.int32),
                            globals={"num_visits": np.asarray(n_vis, np.int32)})
  graph = graph_lib.pad_to_budget(graph, n_node=b.nodes, n_edge=b.edges, n_graph=b.graphs + 1)
  visit_node = np.zeros((b.nodes, b.visits), np.float32)
  if vns:
    visit_node[:offset] = np.concatenate(vns)
  pairs = np.full((b.pairs, 2), offset, np.int32)        # padding pairs: padding node -> padding node
  real_pairs = np.stack([cat(pin, np.int32), cat(pout, np.int32)], 1) if pin else np.zeros((0, 2), np.int32)
  if len(real_pairs) > b.pairs:
    raise ValueError(f"collate: {len(real_pairs)} node pairs exceed the budget of {b.pairs}; recompute budgets_for.")
  pairs[: len(real_pairs)] = real_pairs
  return {"graph": graph, "visit_node": visit_node, "pairs": pairs, "codes": codes, "valid": valid}


def build_patient_graphs(visits: Sequence[Sequence[Sequence[int]]], concept_kg: ConceptKG,
                         budgets: Budgets | None = None, max_visits: int | None = None):
  """Builds the padded batch of personalised KGs of several patients (the binding API).

  Args:
    visits: B patients, each a list of visits (chronological), each a list of concept indices.
    concept_kg: clustered concept KGs (`kg.cluster_kg`).
    budgets: static shapes (default: exactly fitting these patients, rounded up to multiples of 8).
    max_visits: keep only each patient's most recent visits.

  Returns:
    (graph, visit_node_matrix): a jraph.GraphsTuple with B real graphs + 1 padding graph (masks from
    common.graph.node_mask / graph_mask), and the [N, V] float32 node x visit matrix (node n of the flat
    layout is in visit j of its patient). `graph.nodes['id']` holds global node ids, `graph.nodes['ehr']`
    flags direct EHR nodes, `graph.edges['relation']` relation ids, `graph.globals['num_visits']` each
    patient's number of visits. BAT computes its node pairs from the graph when none are given; use
    `collate` / `Batcher` for the precomputed pair list of training batches.
  """
  pgs = [patient_graph(v, concept_kg, max_visits) for v in visits]
  budgets = budgets_for(pgs, len(pgs)) if budgets is None else budgets
  out = collate(pgs, budgets)
  return out["graph"], out["visit_node"]


def dense_visit_node_matrix(graph, visit_node: np.ndarray, num_nodes: int) -> np.ndarray:
  """Expands the [N, V] node x visit matrix into the official global multi-hot [G, V, M] (for checks).

  Args:
    graph: the padded GraphsTuple of `collate` / `build_patient_graphs`.
    visit_node: [N, V].
    num_nodes: M.

  Returns:
    [G, V, M] float32 with out[g, j, id] = 1 when node `id` is in visit j of patient g.
  """
  ids = np.asarray(graph.nodes["id"])
  n_node = np.asarray(graph.n_node)
  v = visit_node.shape[1]
  out = np.zeros((len(n_node), v, num_nodes), np.float32)
  off = 0
  for g in range(len(n_node) - 1):  # the last graph is padding
    n = int(n_node[g])
    out[g][:, ids[off:off + n]] = visit_node[off:off + n].T
    off += n
  return out


def stack_shards(shards: Sequence[dict]) -> dict:
  """Stacks equal-budget shards into one batch with a leading [S] axis on every leaf."""
  import jax
  return jax.tree.map(lambda *xs: np.stack(xs), *shards)


class Batcher:
  """Makes sharded batches of patient graphs and labels from a data set, deterministically.

  Args:
    graphs: all PatientGraphs of the data set (index = sample index).
    labels: [num_samples, ...] labels.
    batch_size: patients per batch (a multiple of num_shards).
    num_shards: shards S per batch (the mesh's data axis must divide S).
    budgets: static shard shapes (default: budgets_for(graphs, batch_size // num_shards)).
  """

  def __init__(self, graphs: Sequence[PatientGraph], labels: np.ndarray, batch_size: int, num_shards: int,
               budgets: Budgets | None = None):
    if batch_size % num_shards:
      raise ValueError(f"batch_size {batch_size} must be a multiple of num_shards {num_shards}.")
    if len(graphs) != len(labels):
      raise ValueError(f"Batcher: {len(graphs)} graphs but {len(labels)} labels.")
    self.graphs, self.labels = list(graphs), np.asarray(labels)
    self.batch_size, self.num_shards = int(batch_size), int(num_shards)
    self.per_shard = self.batch_size // self.num_shards
    self.budgets = budgets_for(self.graphs, self.per_shard) if budgets is None else budgets

  def batch(self, indices: Sequence[int]) -> dict:
    """A batch of up to batch_size samples (fewer are filled with empty invalid graphs).

    Returns:
      dict with graph (GraphsTuple, [S, ...] leaves), visit_node [S, N, V], pairs [S, P, 2],
      codes [S, G, V, K], valid [S, G], label [S, G, ...] (G = per-shard graphs + 1 padding graph).
    """
    idx = list(indices)
    if len(idx) > self.batch_size:
      raise ValueError(f"Batcher.batch: {len(idx)} indices for a batch of {self.batch_size}.")
    idx = idx + [-1] * (self.batch_size - len(idx))
    shards = []
    label_shape = self.labels.shape[1:]
    for s in range(self.num_shards):
      part = idx[s * self.per_shard:(s + 1) * self.per_shard]
      sh = collate([self.graphs[i] if i >= 0 else None for i in part], self.budgets)
      lab = np.zeros((self.per_shard + 1,) + label_shape, self.labels.dtype)
      for g, i in enumerate(part):
        if i >= 0:
          lab[g] = self.labels[i]
      sh["label"] = lab
      shards.append(sh)
    return stack_shards(shards)

  def train_batches(self, indices: np.ndarray, seed: int):
    """Returns `step -> batch`: epochs of shuffled `indices` (drop_last), deterministic in the step."""
    indices = np.asarray(indices)
    per_epoch = max(len(indices) // self.batch_size, 1)

    def fn(step: int) -> dict:
      epoch, k = divmod(int(step), per_epoch)
      perm = np.random.default_rng([seed, epoch]).permutation(indices)
      if len(perm) < self.batch_size:
        perm = np.resize(perm, self.batch_size)
      return self.batch(perm[k * self.batch_size:(k + 1) * self.batch_size])

    return fn

  def eval_batches(self, indices: np.ndarray):
    """Yields batches covering `indices` once, in order (the last one filled with invalid graphs)."""
    indices = np.asarray(indices)
    for start in range(0, len(indices), self.batch_size):
      yield self.batch(indices[start:start + self.batch_size])
