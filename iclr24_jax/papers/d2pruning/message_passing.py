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

from iclr24_jax.common import checks
from iclr24_jax.common.graph import GraphsTuple
from iclr24_jax.papers.d2pruning.dataset_graph import edge_distances, num_graph_nodes

__all__ = ["forward_message_passing", "reverse_message_passing_select", "select_from_table", "select_from_lists",
           "neighbour_lists", "auto_block_size"]


def _check_scores(scores, n: int | None = None, name: str = "scores", where: str = "d2pruning"):
  """Structure at trace time; NaN / inf scores raise eagerly, else the condition is returned for the poison."""
  if np.ndim(scores) != 1:
    raise checks.ShapeError(f"{where}: {name} must be a 1-D array [N]; got shape {np.shape(scores)}.")
  if n is not None and np.shape(scores)[0] != n:
    raise checks.ShapeError(f"{where}: {name} has {np.shape(scores)[0]} entries but the graph has {n} nodes "
                            "(padding included); pad the scores with the graph (e.g. zeros for padding nodes).")
  return checks.finite(where, name, scores, "difficulty scores must be finite (check the training dynamics, "
                       "e.g. a diverged run).")


def _check_gamma(where: str, name: str, gamma) -> object:
  return checks.in_range(where, name, gamma, 0.0, None, hint="the edge kernel exp(-gamma d) decays with distance "
                         "(official forward 1, reverse 0.1).")


def _empty_picks(size: int) -> jax.Array:
  # budget 0: nothing to select (the selection loops index a [0] output otherwise).
  return jnp.full((size,), -1, jnp.int32)


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
    [N] updated scores rho (float32). Padding nodes receive only padding messages. Non-finite scores or a
    gamma < 0 raise named errors eagerly and give NaN under jit / vmap.
  """
  where = "d2pruning.forward_message_passing"
  checks.choice(where, "mode", mode, ("sum", "product"), "forward message passing mode")
  n = num_graph_nodes(graph)
  ok = checks.all_ok(_check_scores(scores, n, where=where), _check_gamma(where, "gamma", gamma))
  s = jnp.asarray(scores, jnp.float32)
  d = edge_distances(graph)
  senders = jnp.asarray(graph.senders, jnp.int32)
  receivers = jnp.asarray(graph.receivers, jnp.int32)
  s_j = s[senders]
  if message_floor is not None:
    s_j = jnp.maximum(s_j, message_floor)
  messages = jnp.exp(-gamma * d) * s_j  # w_ij, Eq. (1)
  agg = jax.ops.segment_sum(messages, receivers, n)  # sum over neighbours j of i
  # The barrier keeps s + sum_j w_ij in that order under jit too (XLA would start the scatter-add from s,
  # changing the last bit of rho and so, rarely, a pick between near-tied examples).
  agg = jax.lax.optimization_barrier(agg)
  return checks.poison(s + agg if mode == "sum" else s * agg, ok)  # Eq. (2)


def auto_block_size(n: int, degree: float = 16.0, chunk: int = 16) -> int:
  """Block size B of the two-level argmax (0 = flat argmax, used below 1,024 nodes).

  A pick costs about c_a * (N / B + B) for the two argmaxes plus c_g * B * (chunk + 1) * ceil(deg / chunk)
  to refresh the maxima of the blocks it touched. XLA's CPU argmax (a tuple reduction) is ~2-4x slower
  per element than the gather + max, so B ~ sqrt(2 N / touched), rounded to a power of two.

  Args:
    n: number of nodes.
    degree: typical number of neighbours updated per pick (the mean degree).
    chunk: neighbour chunk of the selection loop.
  """
  if n < 1024:
    return 0
  touched = max(chunk * max(1, math.ceil(degree / chunk)) + 1, 1)
  return max(8, int(2 ** round(math.log2(math.sqrt(2.0 * n / touched)))))


def select_from_lists(neighbours: jax.Array, distances: jax.Array, starts: jax.Array, degrees: jax.Array,
                      scores: jax.Array, budget, gamma: float = 0.1, eligible: jax.Array | None = None,
                      groups: jax.Array | None = None, quotas: jax.Array | None = None,
                      block_size: int | None = None, out_size: int | None = None, chunk: int = 16) -> jax.Array:
  """Reverse message passing selection over neighbour lists (the core loop; jittable).

  Node i's neighbours are neighbours[starts[i] : starts[i] + degrees[i]] (a CSR layout; a padded
  [N, k_max] table is the special case starts = i * k_max). Each pick updates its neighbours in chunks
  of `chunk` (an inner while_loop), so a step costs O(deg(u) + chunk) for the updates, not O(max degree):
  symmetric kNN graphs of high-dimensional data have hubs with hundreds of times k neighbours.

  With `block_size` B > 0 the argmax is two-level: over N / B block maxima, then inside one block; the
  maxima of blocks touched by an update are refreshed. B = 0 is a flat O(N) argmax. Both pick the first
  index among ties, like np.argmax in the official loop.

  Args:
    neighbours: [M] int32 neighbour indices; entries >= N are ignored.
    distances: [M] edge distances.
    starts, degrees: [N] int32 row offsets and lengths into `neighbours`.
    scores: [N] starting scores rho (usually forward message passing output).
    budget: number of picks: a static int, or a traced int when `out_size` is given.
    gamma: gamma_r of the reverse kernel exp(-gamma_r * d).
    eligible: optional [N] bool; ineligible examples are never picked (padding, hard cutoff).
    groups: optional [N] int32 group ids in [0, G) (strata); with `quotas` [G], at most quotas[g] picks
      come from group g. Groups should be disconnected in the graph (per-stratum graphs).
    quotas: optional [G] int32 per-group budgets.
    block_size: argmax block size; None = `auto_block_size`, 0 = flat.
    out_size: static output length >= budget (then `budget` may be traced: one compiled loop for every
      budget); default = budget.
    chunk: neighbours updated per inner step (static).

  Returns:
    [out_size or budget] int32 picks in selection order; -1 where nothing eligible was left (and after
    the budget). Budget 0 gives an empty array. Under jit, non-finite scores or a traced gamma < 0 give all -1
    (the sentinel); eager calls raise.
  """
  where = "d2pruning.select_from_lists"
  ok = checks.all_ok(_check_scores(scores, where=where), _check_gamma(where, "gamma", gamma))
  if out_size is None:
    budget = checks.static_int(where, "budget", budget, low=0)
  else:
    out_size = checks.static_int(where, "out_size", out_size, low=0)
  if (budget if out_size is None else out_size) == 0:
    return _empty_picks(0)
  return checks.poison(_select_from_lists(neighbours, distances, starts, degrees, scores, budget, gamma, eligible,
                                          groups, quotas, block_size, out_size, chunk), ok, int_fill=-1)


def _select_from_lists(neighbours, distances, starts, degrees, scores, budget, gamma, eligible, groups, quotas,
                       block_size, out_size, chunk):
  n = scores.shape[0]
  if (groups is None) != (quotas is None):
    raise ValueError("pass both groups and quotas (per-group budgets), or neither.")
  if block_size is None:
    bsz = auto_block_size(n, float(neighbours.shape[0]) / max(n, 1), chunk)
  else:
    bsz = int(block_size)
  blocked = bsz > 0
  num_blocks = -(-n // bsz) if blocked else 1
  size = num_blocks * bsz if blocked else n
  pad_index = size  # out of range of the (padded) score array: scatters drop it
  # pad the lists by one chunk so a dynamic_slice never runs past the end (it would be shifted back)
  nbr = jnp.pad(jnp.where(neighbours >= n, pad_index, neighbours).astype(jnp.int32), (0, chunk),
                constant_values=pad_index)
  w = jnp.pad(jnp.where(neighbours >= n, 0.0, jnp.exp(-gamma * jnp.where(jnp.isfinite(distances), distances, 0.0))),
              (0, chunk))
  starts = jnp.asarray(starts, jnp.int32)
  degrees = jnp.asarray(degrees, jnp.int32)
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
  lane = jnp.arange(chunk, dtype=jnp.int32)

  def refresh(block_max, rho, idx):
    blocks = idx // bsz  # pad_index -> num_blocks: dropped
    vals = rho.reshape(num_blocks, bsz)[jnp.clip(blocks, 0, num_blocks - 1)].max(-1)
    return block_max.at[blocks].set(vals, mode="drop")

  def body(t, carry):
    rho, block_max, remaining, out = carry
    if blocked:
      b = jnp.argmax(block_max)
      u = (b * bsz + jnp.argmax(jax.lax.dynamic_slice(rho, (b * bsz,), (bsz,)))).astype(jnp.int32)
    else:
      u = jnp.argmax(rho).astype(jnp.int32)
    rho_u = rho[u]
    ok = rho_u > -jnp.inf
    uc = jnp.minimum(u, n - 1)
    start, deg = starts[uc], jnp.where(ok, degrees[uc], 0)

    def update(c_carry):  # Eq. (3) on one chunk of u's neighbours: rho_v -= exp(-gamma_r d_uv) rho_u
      c, rho, block_max = c_carry
      idx = jax.lax.dynamic_slice(nbr, (start + c * chunk,), (chunk,))
      wc = jax.lax.dynamic_slice(w, (start + c * chunk,), (chunk,))
      live = c * chunk + lane < deg
      idx = jnp.where(live, idx, pad_index)
      rho = rho.at[idx].add(-wc * rho_u, mode="drop")
      if blocked:
        block_max = refresh(block_max, rho, idx)
      return c + 1, rho, block_max

    _, rho, block_max = jax.lax.while_loop(lambda c_carry: c_carry[0] * chunk < deg, update,
                                           (jnp.int32(0), rho, block_max))
    rho = rho.at[u].set(-jnp.inf)  # never chosen again
    exhausted = jnp.asarray(False)
    if groups is not None:
      g = groups[uc]
      remaining = remaining.at[g].add(jnp.where(ok, -1, 0))
      exhausted = ok & (remaining[g] <= 0)
      rho = jax.lax.cond(exhausted, lambda r: jnp.where(groups_p == g, -jnp.inf, r), lambda r: r, rho)
    if blocked:
      block_max = jax.lax.cond(exhausted, lambda r: r.reshape(num_blocks, -1).max(-1),
                               lambda r: refresh(block_max, r, u[None]), rho)
    out = out.at[t].set(jnp.where(ok, u, -1))
    return rho, block_max, remaining, out

  _, _, _, out = jax.lax.fori_loop(0, budget, body, (rho, block_max, remaining, out))
  return out


def select_from_table(neighbours: jax.Array, distances: jax.Array, scores: jax.Array, budget, gamma: float = 0.1,
                      eligible: jax.Array | None = None, groups: jax.Array | None = None,
                      quotas: jax.Array | None = None, block_size: int | None = None,
                      out_size: int | None = None, chunk: int = 16) -> jax.Array:
  """Reverse message passing selection on a padded [N, k_max] neighbour table (`neighbour_table`).

  Same loop as `select_from_lists` with row i at offset i * k_max (valid entries first, padding = N).

  Args:
    neighbours: [N, k_max] int32, padded with N; distances: [N, k_max].
    scores, budget, gamma, eligible, groups, quotas, block_size, out_size, chunk: see `select_from_lists`.

  Returns:
    [budget] (or [out_size]) int32 picks in selection order (-1: nothing eligible left; empty for budget 0).
  """
  checks.shapes("d2pruning.select_from_table", neighbours=(neighbours, "N K"), distances=(distances, "N K"),
                scores=(scores, "N"))
  n, k_max = neighbours.shape
  degrees = jnp.sum(neighbours < n, axis=1).astype(jnp.int32)
  starts = jnp.arange(n, dtype=jnp.int32) * k_max
  return select_from_lists(neighbours.reshape(-1), distances.reshape(-1), starts, degrees, scores, budget, gamma,
                           eligible, groups, quotas, block_size, out_size, chunk)


def neighbour_lists(graph: GraphsTuple, num_nodes: int | None = None, node_mask=None
                    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """CSR neighbour lists of a graph (jittable): node i's neighbours are the senders of its incoming edges.

  Args:
    graph: GraphsTuple with distances as edges (any edge order).
    num_nodes: N (default: the graph's node count).
    node_mask: optional [N] bool; edges into padding nodes are dropped (degree 0).

  Returns:
    (neighbours [E] int32, distances [E] float32, starts [N] int32, degrees [N] int32).
  """
  n = num_graph_nodes(graph) if num_nodes is None else int(num_nodes)
  receivers = jnp.asarray(graph.receivers, jnp.int32)
  senders = jnp.asarray(graph.senders, jnp.int32)
  d = edge_distances(graph)
  order = jnp.argsort(receivers, stable=True)
  r, s, d = receivers[order], senders[order], d[order]
  degrees = jax.ops.segment_sum(jnp.ones_like(r), r, n)
  if node_mask is not None:
    degrees = jnp.where(jnp.asarray(node_mask), degrees, 0)
  starts = jnp.searchsorted(r, jnp.arange(n, dtype=jnp.int32), side="left").astype(jnp.int32)
  return s, d, starts, degrees.astype(jnp.int32)


def reverse_message_passing_select(graph: GraphsTuple, scores: jax.Array, budget: int, gamma: float = 0.1, *,
                                   node_mask: jax.Array | None = None, eligible: jax.Array | None = None,
                                   groups: jax.Array | None = None, quotas: jax.Array | None = None,
                                   block_size: int | None = None, chunk: int = 16) -> jax.Array:
  """Selects `budget` examples by reverse message passing (D2 Pruning's sampling step).

  Jittable with a static `budget` (`jax.jit(f, static_argnames='budget')`); the graph becomes CSR
  neighbour lists and each pick updates only its own neighbours (O(deg + chunk)), plus a two-level
  argmax (O(N / B + B)).

  Args:
    graph: dataset graph with distances as edges (`knn_graph`), possibly padded (`pad_to_budget`).
    scores: [N] scores to select by (usually `forward_message_passing` output), padding included.
    budget: number of examples to select (static int).
    gamma: gamma_r of the reverse kernel exp(-gamma_r * d) (paper default 0.1, tuned per data set).
    node_mask: [N] bool of real nodes for a padded graph (`common.graph.node_mask(padded)`).
    eligible: [N] bool of selectable examples (e.g. after the hard-example cutoff).
    groups, quotas: per-stratum budgets (see `select_from_lists`).
    block_size: argmax block size (None = auto, 0 = flat).
    chunk: neighbours updated per inner step.

  Returns:
    [budget] int32 indices in selection order, no repeats; -1 entries only if fewer than `budget`
    examples were eligible (checked on the host when the inputs are readable); empty for budget 0. Under jit,
    non-finite scores or a traced gamma < 0 give all -1; eager calls raise.
  """
  where = "d2pruning.reverse_message_passing_select"
  n = num_graph_nodes(graph)
  _check_scores(scores, n, where=where)
  _check_gamma(where, "gamma", gamma)
  budget = checks.static_int(where, "budget", budget, low=0)
  if budget > n:
    raise checks.HyperparameterError(f"{where}: budget {budget} exceeds the number of examples {n}.")
  mask = None
  if node_mask is not None:
    mask = jnp.asarray(node_mask, bool)
  if eligible is not None:
    mask = jnp.asarray(eligible, bool) if mask is None else mask & jnp.asarray(eligible, bool)
  if mask is not None and checks.is_readable(mask):
    avail = int(np.sum(np.asarray(mask)))
    if quotas is not None and checks.is_readable(quotas):
      avail = min(avail, int(np.sum(np.asarray(quotas))))
    if budget > avail:
      raise checks.HyperparameterError(f"{where}: budget {budget} exceeds the {avail} selectable examples (after "
                                       "padding / cutoff / quotas); lower the budget or the hard-example cutoff.")
  if budget == 0:
    return _empty_picks(0)
  nbr, dist, starts, degrees = neighbour_lists(graph, n, node_mask)
  return select_from_lists(nbr, dist, starts, degrees, scores, budget, gamma, eligible=mask, groups=groups,
                           quotas=quotas, block_size=block_size, chunk=chunk)
