"""The dataset graph of D2 Pruning: a symmetric kNN graph over example embeddings.

Nodes are training examples, edges join each example to its k nearest neighbours (Euclidean) and are
made undirected (the union of i->j and j->i, as the official `GraphDensitySampler` does with
`kneighbors_graph` followed by writing both `connect[i, j]` and `connect[j, i]`). Edge features are the
distances. Two layouts of the same graph:

* a `jraph.GraphsTuple` (edge list, senders -> receivers), used by forward message passing
  (`jax.ops.segment_sum` over receivers), and
* a padded neighbour table `[N, k_max]` (row i lists i's neighbours, padded with the index N), used by
  the reverse message passing selection loop so that each step touches O(k_max) entries.

`groups` restricts edges to pairs in the same group (a class, a score stratum): the result is the
disjoint union of per-group graphs, which lets one compiled graph / selection loop serve every stratum.
Examples with a negative group id (e.g. removed by the hard-example cutoff) get no edges.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.common import graph as graph_lib
from iclr24_jax.common.graph import GraphsTuple

__all__ = ["knn_graph", "neighbour_table", "max_degree", "num_graph_nodes"]


def _check_embeddings(embeddings, where: str = "d2pruning.knn_graph") -> np.ndarray | jax.Array:
  if np.ndim(embeddings) != 2:
    raise checks.ShapeError(f"{where}: embeddings must be a 2-D array [N, D]; got shape {np.shape(embeddings)}. "
                            "Flatten images or pass penultimate-layer features.")
  checks.finite(where, "embeddings", embeddings, "check the feature extractor (e.g. a diverged classifier).")
  return embeddings


def _edges_from_table(dist: np.ndarray, idx: np.ndarray, valid: np.ndarray, symmetric: bool):
  n, k = idx.shape
  receivers = np.repeat(np.arange(n, dtype=np.int64), k)[valid.reshape(-1)]
  senders = idx.reshape(-1).astype(np.int64)[valid.reshape(-1)]
  d = dist.reshape(-1)[valid.reshape(-1)]
  if symmetric:
    senders, receivers = np.concatenate([senders, receivers]), np.concatenate([receivers, senders])
    d = np.concatenate([d, d])
  # one edge per (receiver, sender) pair, sorted by receiver then sender
  _, first = np.unique(receivers * n + senders, return_index=True)
  return senders[first], receivers[first], d[first]


def knn_graph(embeddings, k: int, groups=None, symmetric: bool = True, squared: bool = False,
              block_size: int = graph_lib.DEFAULT_BLOCK) -> GraphsTuple:
  """Builds the (symmetric) k-nearest-neighbour dataset graph.

  Exact blocked top-k (`iclr24_jax.common.graph.knn`, O(block_size * N) memory), so N = 1e5 fits on a
  CPU. Built on the host: the number of edges of a symmetric kNN graph depends on the data.

  Args:
    embeddings: [N, D] example embeddings (penultimate-layer features, sentence embeddings ...).
    k: neighbours per example (the paper uses 5 or 10).
    groups: optional [N] int; edges only join examples of the same group; a negative id removes the
      example from the graph (no edges). Groups with <= k members get fewer neighbours.
    symmetric: take the union of i->j and j->i (the paper's undirected graph). False keeps the directed
      kNN lists (the official DataComp variant with precomputed neighbours).
    squared: store squared Euclidean distances (the official code uses plain Euclidean distances for
      the vision experiments; faiss L2 search in its DataComp script returns squared ones).
    block_size: query rows per distance block.

  Returns:
    GraphsTuple with nodes = embeddings [N, D], edges = distances [E, 1] float32, senders/receivers
    [E] int32 sorted by receiver (receiver i aggregates over its neighbours), n_node = [N].
  """
  where = "d2pruning.knn_graph"
  _check_embeddings(embeddings, where)
  x = checks.host_array(where, "embeddings", embeddings, np.float32)
  n = x.shape[0]
  if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
    raise checks.HyperparameterError(f"{where}: k must be a positive integer; got {k!r}.")
  if k > n - 1:
    raise ValueError(f"k={k} neighbours requested but only {n - 1} other examples exist; lower k.")
  if groups is not None:
    groups = np.asarray(groups)
    if groups.shape != (n,):
      raise ValueError(f"groups must have shape [N] = ({n},); got {groups.shape}.")
  # The shared blocked kernel (its group mask keeps neighbours inside a group, absent slots at distance inf).
  # Squared distances come back and the square root is taken here on the host: the same correctly rounded
  # float32 sqrt, without compiling and dispatching a separate device program for it.
  d2, idx = graph_lib.knn(x, k, block_size=block_size, squared=True, groups=groups)
  dist, idx = np.sqrt(np.asarray(d2)), np.asarray(idx)
  valid = np.isfinite(dist) if groups is not None else np.ones(dist.shape, bool)
  senders, receivers, d = _edges_from_table(np.where(valid, dist, 0.0), idx, valid, symmetric)
  g = graph_lib.graph_from_edges(senders, receivers, n, nodes=x, edges=d.astype(np.float32)[:, None])
  if squared:
    g = g._replace(edges=np.square(np.asarray(g.edges, np.float32)))
  return g


def num_graph_nodes(graph: GraphsTuple) -> int:
  """Total (static) number of nodes of a graph, padding included."""
  if graph.nodes is not None:
    return int(jax.tree_util.tree_leaves(graph.nodes)[0].shape[0])
  return int(np.sum(np.asarray(graph.n_node)))


def max_degree(graph: GraphsTuple, node_mask=None) -> int:
  """Largest number of incoming edges of a real node (host computation; the graph must be concrete).

  Args:
    graph: a GraphsTuple (possibly padded).
    node_mask: optional [N] bool of real nodes; edges into padding nodes are ignored.
  """
  receivers = np.asarray(graph.receivers)
  n = num_graph_nodes(graph)
  deg = np.bincount(receivers, minlength=n)[:n]
  if node_mask is not None:
    deg = np.where(np.asarray(node_mask), deg, 0)
  return max(int(deg.max(initial=0)), 1)


def edge_distances(graph: GraphsTuple) -> jax.Array:
  """The [E] edge distances stored in a k-NN dataset graph's `edges` ([E] or [E, 1]).

  Args:
    graph: a jraph GraphsTuple from `knn_graph` (edges hold distances).

  Returns:
    [E] float distances.
  """
  if graph.edges is None:
    raise ValueError("the graph has no edge features; D2 Pruning needs the edge distances as graph.edges "
                     "([E] or [E, 1]); build it with d2pruning.knn_graph.")
  d = jnp.asarray(graph.edges, jnp.float32)
  if d.ndim == 2 and d.shape[1] == 1:
    d = d[:, 0]
  if d.ndim != 1:
    raise ValueError(f"graph.edges must be distances of shape [E] or [E, 1]; got {d.shape}.")
  return d


def neighbour_table(graph: GraphsTuple, k_max: int, num_nodes: int | None = None, node_mask=None
                    ) -> tuple[jax.Array, jax.Array]:
  """Converts a graph to a padded neighbour table (jittable for a static k_max).

  Row i lists the senders of the edges received by i (its neighbours) in edge order. Padding entries
  hold the index N (out of range: scatters with mode='drop' ignore them) and distance inf.

  Args:
    graph: GraphsTuple with distances as edges.
    k_max: static table width; must be >= the largest degree (`max_degree(graph)`), else neighbours
      are silently dropped (checked on the host when the graph is concrete).
    num_nodes: N (defaults to the node count of the graph).
    node_mask: optional [N] bool; rows of padding nodes are emptied.

  Returns:
    (neighbours [N, k_max] int32, distances [N, k_max] float32).
  """
  n = num_graph_nodes(graph) if num_nodes is None else int(num_nodes)
  receivers = jnp.asarray(graph.receivers, jnp.int32)
  senders = jnp.asarray(graph.senders, jnp.int32)
  d = edge_distances(graph)
  if checks.is_readable(graph.receivers, node_mask):
    need = max_degree(graph, node_mask)
    if need > k_max:
      raise ValueError(f"k_max={k_max} is smaller than the largest node degree {need}; "
                       f"pass k_max >= {need} (d2pruning.max_degree(graph)).")
  order = jnp.argsort(receivers, stable=True)
  r, s, d = receivers[order], senders[order], d[order]
  deg = jax.ops.segment_sum(jnp.ones_like(r), r, n)
  start = jnp.cumsum(deg) - deg
  pos = jnp.arange(r.shape[0], dtype=jnp.int32) - start[jnp.clip(r, 0, n - 1)]
  if node_mask is not None:
    keep = jnp.asarray(node_mask)[jnp.clip(r, 0, n - 1)]
    pos = jnp.where(keep, pos, k_max)  # dropped below
  nbr = jnp.full((n, k_max), n, jnp.int32).at[r, pos].set(s, mode="drop")
  dist = jnp.full((n, k_max), jnp.inf, jnp.float32).at[r, pos].set(d, mode="drop")
  return nbr, dist
