"""Graphs: the library's only jraph import, padding to fixed budgets, masks, and exact kNN graphs.

jraph (archived upstream, pinned 0.0.6.dev0) still calls `jax.tree_map` / `jax.tree_leaves`, which
JAX removed; the aliases are restored here before jraph is imported. Import jraph through this
module (`from iclr24_jax.common.graph import jraph`).

Graphs that reach `jax.jit` are padded to a fixed budget (+1 node and +1 graph for the padding
graph) so a step compiles once; losses and pooling are masked with `node_mask` / `graph_mask`.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import compile_cache

if not hasattr(jax, "tree_map"):
  jax.tree_map = jax.tree_util.tree_map  # jraph.zero_out_padding, get_fully_connected_graph
if not hasattr(jax, "tree_leaves"):
  jax.tree_leaves = jax.tree_util.tree_leaves

import jraph  # noqa: E402  (after the shim on purpose)

GraphsTuple = jraph.GraphsTuple
segment_sum = jax.ops.segment_sum
segment_max = jax.ops.segment_max
segment_mean = jraph.segment_mean
segment_softmax = jraph.segment_softmax

__all__ = ["jraph", "GraphsTuple", "pad_to_budget", "round_budget", "node_mask", "edge_mask", "graph_mask",
           "knn", "knn_graph", "graph_from_edges", "segment_sum", "segment_max", "segment_mean",
           "segment_softmax", "aggregate"]


def round_budget(n: int, multiple: int = 64) -> int:
  """Rounds n up to a multiple (power-of-two-ish budgets keep the number of compiled shapes small)."""
  if n <= 0:
    return multiple
  return int(math.ceil(n / multiple) * multiple)


def pad_to_budget(graph: GraphsTuple, n_node: int | None = None, n_edge: int | None = None,
                  n_graph: int | None = None, multiple: int = 64) -> GraphsTuple:
  """Pads a (batched) graph with one padding graph to fixed sizes.

  Args:
    graph: a GraphsTuple with numpy/jax arrays.
    n_node, n_edge, n_graph: the budget after padding (must exceed the real sizes: n_node >= real + 1,
      n_graph >= real + 1). None rounds the real size (+1) up to `multiple`.

  Returns:
    The padded graph; real nodes/edges/graphs keep their positions, padding comes last.
  """
  real_nodes = int(np.sum(graph.n_node))
  real_edges = int(np.sum(graph.n_edge))
  real_graphs = int(np.shape(graph.n_node)[0])
  n_node = round_budget(real_nodes + 1, multiple) if n_node is None else n_node
  n_edge = round_budget(real_edges, multiple) if n_edge is None else n_edge
  n_graph = real_graphs + 1 if n_graph is None else n_graph
  if n_node < real_nodes + 1 or n_edge < real_edges or n_graph < real_graphs + 1:
    raise ValueError(f"padding budget (nodes {n_node}, edges {n_edge}, graphs {n_graph}) is too small for a graph "
                     f"with {real_nodes} nodes, {real_edges} edges, {real_graphs} graphs (+1 node, +1 graph needed).")
  return jraph.pad_with_graphs(graph, n_node, n_edge, n_graph)


def node_mask(graph: GraphsTuple) -> jax.Array:
  """[N] bool, True on real nodes."""
  return jraph.get_node_padding_mask(graph)


def edge_mask(graph: GraphsTuple) -> jax.Array:
  """[E] bool, True on real edges."""
  return jraph.get_edge_padding_mask(graph)


def graph_mask(graph: GraphsTuple) -> jax.Array:
  """[G] bool, True on real graphs."""
  return jraph.get_graph_padding_mask(graph)


def aggregate(messages: jax.Array, receivers: jax.Array, num_nodes: int, mode: str = "sum") -> jax.Array:
  """Aggregates edge messages [E, F] at their receivers -> [N, F] ('sum', 'mean' or 'max')."""
  if mode == "sum":
    return segment_sum(messages, receivers, num_nodes)
  if mode == "mean":
    return segment_mean(messages, receivers, num_nodes)
  if mode == "max":
    out = segment_max(messages, receivers, num_nodes)
    return jnp.where(jnp.isfinite(out), out, 0.0)
  raise ValueError(f"unknown aggregation '{mode}'; choose 'sum', 'mean' or 'max'.")


def graph_from_edges(senders: np.ndarray, receivers: np.ndarray, num_nodes: int, nodes=None, edges=None,
                     globals_=None) -> GraphsTuple:
  """A single-graph GraphsTuple from edge lists (no padding)."""
  senders = np.asarray(senders, np.int32)
  receivers = np.asarray(receivers, np.int32)
  return GraphsTuple(nodes=nodes, edges=edges, senders=senders, receivers=receivers,
                     n_node=np.asarray([num_nodes], np.int32), n_edge=np.asarray([len(senders)], np.int32),
                     globals=globals_)


# Query rows per distance block of `knn`. Small blocks keep the [block, N] distance buffer small, and so its
# first-touch page faults: at N = 2,000 (D 64, k 10) a 2,048-row block (one block, 16 MB) cost ~4,200 page faults
# in each of a fresh process's first D2 selections and ~5 ms more CPU per selection than 256-row blocks (~700
# faults), with the same picks; the kNN alone at N = 20,000 took ~7% less CPU in 256-row blocks (fresh processes,
# load ~3 on 2 cores, 2026-12-04).
DEFAULT_BLOCK = 256


@functools.partial(jax.jit, static_argnames=("k", "block_size", "exclude_self"))
def _knn_blocked(x: jax.Array, groups: jax.Array | None, k: int, block_size: int,
                 exclude_self: bool) -> tuple[jax.Array, jax.Array]:
  n = x.shape[0]
  sq = jnp.sum(x * x, axis=-1)
  num_blocks = -(-n // block_size)
  pad = num_blocks * block_size - n
  xq = jnp.pad(x, ((0, pad), (0, 0))).reshape(num_blocks, block_size, -1)
  sqq = jnp.pad(sq, (0, pad)).reshape(num_blocks, block_size)
  row_ids = jnp.arange(num_blocks * block_size).reshape(num_blocks, block_size)
  gq = (jnp.zeros((num_blocks, block_size), jnp.int32) if groups is None else
        jnp.pad(groups, (0, pad), constant_values=-1).reshape(num_blocks, block_size))

  def one_block(_, blk):
    q, q_sq, rows, q_g = blk
    d2 = q_sq[:, None] - 2.0 * q @ x.T + sq[None, :]  # |q|^2 - 2 q.x + |x|^2, [block, N]
    d2 = jnp.maximum(d2, 0.0)
    if exclude_self:
      d2 = jnp.where(rows[:, None] == jnp.arange(n)[None, :], jnp.inf, d2)
    if groups is not None:  # only rows of the same non-negative group are neighbours
      same = (q_g[:, None] == groups[None, :]) & (q_g[:, None] >= 0)
      d2 = jnp.where(same, d2, jnp.inf)
    neg, idx = jax.lax.top_k(-d2, k)
    return None, (-neg, idx)

  _, (d2, idx) = jax.lax.scan(one_block, None, (xq, sqq, row_ids, gq))
  return d2.reshape(-1, k)[:n], idx.reshape(-1, k)[:n]


def knn(x: jax.Array | np.ndarray, k: int, block_size: int = DEFAULT_BLOCK, exclude_self: bool = True,
        squared: bool = False, groups: jax.Array | np.ndarray | None = None) -> tuple[jax.Array, jax.Array]:
  """Exact k nearest neighbours (Euclidean) of every row of x among all rows, in query blocks.

  Memory is O(block_size * N) per block, so N = 1e5 fits on a CPU (see shared/notes/knn-cpu.md).
  Ties are broken by the lower index (jax.lax.top_k's order).

  Args:
    x: [N, D] points.
    k: neighbours per point.
    block_size: query rows per block (`DEFAULT_BLOCK`; memory O(block_size * N)).
    exclude_self: drop each point from its own list.
    squared: return squared distances.
    groups: optional [N] int group ids (a group mask): neighbours are taken only among rows of the same
      group, and a row with a negative id has none. Where a group has fewer than k other members the
      missing slots have distance inf (and an arbitrary index): filter them with `jnp.isfinite(dist)`.

  Returns:
    (distances [N, k] ascending, indices [N, k] int32).
  """
  # Host inputs stay numpy: `cached_call` then keeps the whole executable (no tracing in a later process).
  host = isinstance(x, np.ndarray) and (groups is None or isinstance(groups, np.ndarray))
  x = np.asarray(x, np.float32) if host else jnp.asarray(x, jnp.float32)
  n = x.shape[0]
  if k > n - int(exclude_self):
    raise ValueError(f"knn: k={k} neighbours requested but only {n - int(exclude_self)} other points exist.")
  if groups is not None:
    groups = np.asarray(groups, np.int32) if host else jnp.asarray(groups, jnp.int32)
    if groups.shape != (n,):
      raise ValueError(f"knn: groups must have shape [N] = ({n},); got {groups.shape}.")
  d2, idx = compile_cache.cached_call(_knn_blocked, x, groups, k=k, block_size=min(block_size, n),
                                      exclude_self=exclude_self)
  return (d2 if squared else jnp.sqrt(d2)), idx


def knn_graph(x: jax.Array | np.ndarray, k: int, symmetric: bool = True, block_size: int = DEFAULT_BLOCK,
              nodes=None) -> GraphsTuple:
  """A kNN graph over the rows of x as a GraphsTuple, edge features = Euclidean distances [E, 1].

  Edges point from neighbour (sender) to point (receiver): receiver i aggregates over its k nearest
  neighbours. With `symmetric=True` the union of i->j and j->i is taken (each undirected pair once
  per direction), built on the host since its size depends on the data.

  Args:
    x: [N, D] points.
    k: neighbours per point.
    symmetric: make the graph undirected.
    nodes: node features (default: x itself).

  Returns:
    GraphsTuple with senders/receivers sorted by receiver, edges [E, 1] float32.
  """
  dist, idx = knn(x, k, block_size=block_size)
  dist, idx = np.asarray(dist), np.asarray(idx)
  n = idx.shape[0]
  receivers = np.repeat(np.arange(n, dtype=np.int64), k)
  senders = idx.reshape(-1).astype(np.int64)
  d = dist.reshape(-1)
  if symmetric:
    s_all = np.concatenate([senders, receivers])
    r_all = np.concatenate([receivers, senders])
    d_all = np.concatenate([d, d])
    key = r_all * n + s_all
    key_u, first = np.unique(key, return_index=True)
    senders, receivers, d = s_all[first], r_all[first], d_all[first]
  else:
    order = np.lexsort((senders, receivers))
    senders, receivers, d = senders[order], receivers[order], d[order]
  nodes = np.asarray(x, np.float32) if nodes is None else nodes
  return graph_from_edges(senders, receivers, n, nodes=nodes, edges=d.astype(np.float32)[:, None])
