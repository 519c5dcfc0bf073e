"""Forward and reverse message passing over the dataset graph (Maharana et al., ICLR 2024, Sec. 3).

Forward message passing spreads difficulty over the graph, so an example in a region of difficult
examples scores higher:

    w_ij  = exp(-gamma_f * d_ij) * s_j                       # message from neighbour j to i
    rho_i = s_i + sum_{j in N(i)} w_ij       (mode 'sum')     # Eq. (1)-(2)
    rho_i = s_i * sum_{j in N(i)} w_ij       (mode 'product', the official code's alternative)

Reverse message passing is the selection loop: take the example with the highest updated score, then
lower its neighbours' scores so the next picks come from other regions (diversity):

    u = argmax_{v not selected} rho_v
    rho_v <- rho_v - exp(-gamma_r * d_uv) * rho_u   for every neighbour v of u      # Eq. (3)

Facts from the official code (core/data/sampling.py, GraphDensitySampler, graph_mode='sum',
graph_sampling_mode='weighted'): d is the plain Euclidean distance (sklearn pairwise_distances); the
forward pass uses exp(-d) (gamma_f = 1, hard-coded); the reverse pass uses exp(-gamma * d) with the
command-line gamma (0.1 in the README); rho_u in the update is u's current (already lowered) score;
selected examples are set to min(rho) - 1 so they are never chosen again (here: -inf).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common.graph import GraphsTuple
from iclr24_jax.papers.d2pruning.dataset_graph import _edge_distances, max_degree, neighbour_table, num_graph_nodes

__all__ = ["forward_message_passing", "reverse_message_passing_select", "select_from_table", "auto_block_size"]


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _check_scores(scores, n: int | None = None, name: str = "scores"):
  if getattr(scores, "ndim", None) != 1:
    raise ValueError(f"{name} must be a 1-D array [N]; got shape {getattr(scores, 'shape', None)}.")
  if n is not None and scores.shape[0] != n:
    raise ValueError(f"{name} has {scores.shape[0]} entries but the graph has {n} nodes (padding included); "
                     "pad the scores with the graph (e.g. zeros for padding nodes).")
  if _is_concrete(scores) and not np.all(np.isfinite(np.asarray(scores))):
    raise ValueError(f"{name} contain NaN or inf; difficulty scores must be finite (check the training "
                     "dynamics, e.g. a diverged run).")


def forward_message_passing(graph: GraphsTuple, scores: jax.Array, gamma: float = 1.0, mode: str = "sum",
                            message_floor: float | None = None) -> jax.Array:
  """Updates every example's difficulty with its neighbours' (forward message passing).

  Args:
    graph: dataset graph with distances as edge features ([E] or [E, 1]); `d2pruning.knn_graph`.
    scores: [N] difficulty scores s (higher = harder); N counts padding nodes of a padded graph.
    gamma: gamma_f of the edge kernel exp(-gamma_f * d). The official vision code uses 1.
    mode: 'sum' (rho = s + sum_j w_ij, the paper's default) or 'product' (rho = s * sum_j w_ij).
    message_floor: if set, messages use max(s_j, floor) (the official dense code floors neighbour
      scores at 1e-7; it matters only for negative scores). None = the paper's formula.

  Returns:
    [N] updated scores rho (float32). Padding nodes receive only padding messages.
  """
  if mode not in ("sum", "product"):
    raise ValueError(f"unknown forward message passing mode '{mode}'; choose 'sum' or 'product'.")
  n = num_graph_nodes(graph)
  _check_scores(scores, n)
  s = jnp.asarray(scores, jnp.float32)
  d = _edge_distances(graph)
  senders = jnp.asarray(graph.senders, jnp.int32)
  receivers = jnp.asarray(graph.receivers, jnp.int32)
  s_j = s[senders]
  if message_floor is not None:
    s_j = jnp.maximum(s_j, message_floor)
  messages = jnp.exp(-gamma * d) * s_j  # w_ij, Eq. (1)
  agg = jax.ops.segment_sum(messages, receivers, n)  # sum over neighbours j of i
  return s + agg if mode == "sum" else s * agg  # Eq. (2)


def auto_block_size(n: int) -> int:
  """Block size of the two-level argmax: a power of two near sqrt(n) (flat argmax below 1,024 nodes)."""
  if n < 1024:
    return 0
  return int(2 ** round(math.log2(math.sqrt(n))))


def select_from_table(neighbours: jax.Array, distances: jax.Array, scores: jax.Array, budget: int,
                      gamma: float = 0.1, eligible: jax.Array | None = None, groups: jax.Array | None = None,
                      quotas: jax.Array | None = None, block_size: int | None = None,
                      out_size: int | None = None) -> jax.Array:
  """Reverse message passing selection on a padded neighbour table (jittable; budget static).

  Each iteration costs O(k_max * block_size) for the neighbour updates plus the argmax: with
  `block_size` B > 0 a two-level argmax over N / B block maxima and one block (O(N / B + B)); with
  B = 0 a flat O(N) argmax. Both give the same picks (the first index among ties).

  Args:
    neighbours: [N, k_max] int32 neighbour table, padded with N (`neighbour_table`).
    distances: [N, k_max] edge distances (padding ignored).
    scores: [N] starting scores rho (usually forward message passing output).
    budget: number of examples to select (static).
    gamma: gamma_r of the reverse kernel exp(-gamma_r * d).
    eligible: optional [N] bool; ineligible examples are never selected (padding, hard cutoff).
    groups: optional [N] int32 group ids in [0, G) (strata); with `quotas`, at most quotas[g] examples
      are taken from group g. Groups should be disconnected in the graph (per-stratum graphs).
    quotas: optional [G] int32 per-group budgets.
    block_size: two-level argmax block size; None = `auto_block_size(N)`, 0 = flat argmax.
    out_size: optional static output length >= budget; then `budget` may be a traced int (one
      compiled loop serves every budget; entries after the budget are -1).

  Returns:
    [budget] (or [out_size]) int32 selected indices in selection order; -1 where nothing eligible
    was left.
  """
  n, k_max = neighbours.shape
  if (groups is None) != (quotas is None):
    raise ValueError("pass both groups and quotas (per-group budgets), or neither.")
  bsz = auto_block_size(n) if block_size is None else int(block_size)
  blocked = bsz > 0
  num_blocks = -(-n // bsz) if blocked else 1
  size = num_blocks * bsz if blocked else n
  pad_index = size  # out of range of the (padded) score array: scatters drop it
  nbr = jnp.where(neighbours >= n, pad_index, neighbours).astype(jnp.int32)
  w = jnp.where(neighbours >= n, 0.0, jnp.exp(-gamma * jnp.where(jnp.isfinite(distances), distances, 0.0)))
  rho = jnp.asarray(scores, jnp.float32)
  if eligible is not None:
    rho = jnp.where(eligible, rho, -jnp.inf)
  if groups is not None:
    groups = jnp.asarray(groups, jnp.int32)
    quotas = jnp.asarray(quotas, jnp.int32)
    rho = jnp.where(quotas[jnp.clip(groups, 0, quotas.shape[0] - 1)] > 0, rho, -jnp.inf)
    groups_p = jnp.pad(groups, (0, size - n), constant_values=-1)
  rho = jnp.pad(rho, (0, size - n), constant_values=-jnp.inf)
  block_max = rho.reshape(num_blocks, -1).max(-1) if blocked else jnp.zeros((1,))
  remaining = quotas if groups is not None else jnp.zeros((1,), jnp.int32)
  out = jnp.full((budget if out_size is None else out_size,), -1, jnp.int32)

  def recompute_all(r):
    return r.reshape(num_blocks, -1).max(-1)

  def body(t, carry):
    rho, block_max, remaining, out = carry
    if blocked:
      b = jnp.argmax(block_max)
      j = jnp.argmax(jax.lax.dynamic_slice(rho, (b * bsz,), (bsz,)))
      u = (b * bsz + j).astype(jnp.int32)
    else:
      u = jnp.argmax(rho).astype(jnp.int32)
    rho_u = rho[u]
    ok = rho_u > -jnp.inf
    nb = nbr[jnp.minimum(u, n - 1)]
    delta = jnp.where(ok, w[jnp.minimum(u, n - 1)] * rho_u, 0.0)
    rho = rho.at[nb].add(-delta, mode="drop")  # Eq. (3): rho_v -= exp(-gamma_r d_uv) rho_u
    rho = rho.at[u].set(-jnp.inf)  # never chosen again
    exhausted = jnp.asarray(False)
    if groups is not None:
      g = groups[jnp.minimum(u, n - 1)]
      remaining = remaining.at[g].add(jnp.where(ok, -1, 0))
      exhausted = ok & (remaining[g] <= 0)
      rho = jax.lax.cond(exhausted, lambda r: jnp.where(groups_p == g, -jnp.inf, r), lambda r: r, rho)
    if blocked:
      def partial(r):
        blocks = jnp.concatenate([u[None] // bsz, nb // bsz])
        vals = r.reshape(num_blocks, bsz)[jnp.clip(blocks, 0, num_blocks - 1)].max(-1)
        return block_max.at[blocks].set(vals, mode="drop")
      block_max = jax.lax.cond(exhausted, recompute_all, partial, rho)
    out = out.at[t].set(jnp.where(ok, u, -1))
    return rho, block_max, remaining, out

  _, _, _, out = jax.lax.fori_loop(0, budget, body, (rho, block_max, remaining, out))
  return out


def reverse_message_passing_select(graph: GraphsTuple, scores: jax.Array, budget: int, gamma: float = 0.1, *,
                                   k_max: int | None = None, node_mask: jax.Array | None = None,
                                   eligible: jax.Array | None = None, groups: jax.Array | None = None,
                                   quotas: jax.Array | None = None, block_size: int | None = None) -> jax.Array:
  """Selects `budget` examples by reverse message passing (D2 Pruning's sampling step).

  Jittable with static `budget` and `k_max` (e.g. `jax.jit(f, static_argnames=('budget', 'k_max'))`);
  the graph is turned into a padded [N, k_max] neighbour table so each step updates O(k_max) scores.

  Args:
    graph: dataset graph with distances as edges (`knn_graph`), possibly padded (`pad_to_budget`).
    scores: [N] scores to select by (usually `forward_message_passing` output), padding included.
    budget: number of examples to select (static int).
    gamma: gamma_r of the reverse kernel exp(-gamma_r * d) (paper default 0.1, tuned per data set).
    k_max: neighbour table width (static); default: the graph's largest degree (needs a concrete graph).
    node_mask: [N] bool of real nodes for a padded graph (`common.graph.node_mask(padded)`).
    eligible: [N] bool of selectable examples (e.g. after the hard-example cutoff).
    groups, quotas: per-stratum budgets (see `select_from_table`).
    block_size: two-level argmax block size (None = auto, 0 = flat).

  Returns:
    [budget] int32 indices in selection order, no repeats; -1 entries only if fewer than `budget`
    examples were eligible (checked on the host when the inputs are concrete).
  """
  n = num_graph_nodes(graph)
  _check_scores(scores, n)
  if not isinstance(budget, (int, np.integer)) or budget < 0:
    raise ValueError(f"budget must be a non-negative int (static); got {budget!r}.")
  if k_max is None:
    if not _is_concrete(graph.receivers):
      raise ValueError("k_max must be given (static) when the graph is traced under jit; "
                       "use d2pruning.max_degree(graph) on the concrete graph.")
    k_max = max_degree(graph, node_mask)
  mask = None
  if node_mask is not None:
    mask = jnp.asarray(node_mask, bool)
  if eligible is not None:
    mask = jnp.asarray(eligible, bool) if mask is None else mask & jnp.asarray(eligible, bool)
  if mask is not None and _is_concrete(mask):
    avail = int(np.sum(np.asarray(mask)))
    if quotas is not None and _is_concrete(quotas):
      avail = min(avail, int(np.sum(np.asarray(quotas))))
    if budget > avail:
      raise ValueError(f"budget {budget} exceeds the {avail} selectable examples (after padding / cutoff / "
                       "quotas); lower the budget or the hard-example cutoff.")
  elif budget > n:
    raise ValueError(f"budget {budget} exceeds the number of examples {n}.")
  nbr, dist = neighbour_table(graph, int(k_max), n, node_mask)
  return select_from_table(nbr, dist, scores, budget, gamma, eligible=mask, groups=groups, quotas=quotas,
                           block_size=block_size)
