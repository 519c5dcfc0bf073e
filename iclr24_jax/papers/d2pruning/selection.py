"""Coreset selection: D2 Pruning and the baselines it is compared with, in one framework.

Methods (`select_coreset(..., method=...)`):
  'd2'         hard-example cutoff -> strata (classes, or CCS score strata) -> kNN graph per stratum ->
               forward message passing -> reverse message passing with per-stratum budgets.
  'random'     uniform sampling (class-balanced when labels are given).
  'difficulty' the `budget` hardest examples (top-k by score; per class when labels are given).
  'ccs'        coverage-centric stratified sampling (Zheng et al., ICLR 2023): hard-example cutoff, equal-
               width score strata, budgets spread evenly over strata (smallest first), random in each.
  'kcenter'    greedy k-center on the embeddings (Sener & Savarese, 2018): diversity only.

`fraction` is the fraction KEPT (the official `--coreset-ratio`); pruning rate = 1 - fraction.
Everything data-dependent (budgets per stratum, graph sizes) is decided on the host; the loops that
cost O(budget) iterations (reverse message passing, k-center) are compiled `fori_loop`s.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.common import compile_cache
from iclr24_jax.common import graph as graph_lib
from iclr24_jax.papers.d2pruning import dataset_graph
from iclr24_jax.papers.d2pruning import message_passing as mp

__all__ = ["select_coreset", "kcenter_greedy", "bin_allocate", "hard_cutoff_mask", "score_strata", "budget_of",
           "METHODS", "d2_select"]

METHODS = ("d2", "random", "difficulty", "ccs", "kcenter")


def budget_of(fraction: float, n: int) -> int:
  """Coreset size for a kept fraction (the official int(ratio * N))."""
  if not (0.0 < float(fraction) <= 1.0):
    raise ValueError(f"fraction (the kept fraction, 1 - pruning rate) must be in (0, 1]; got {fraction}.")
  return int(math.floor(float(fraction) * n + 1e-6))


def bin_allocate(num: int, sizes) -> np.ndarray:
  """Spreads a budget over bins as evenly as their sizes allow (CCS `bin_allocate`, uniform mode).

  Bins are visited from the smallest up; each gets min(size, remaining // non-empty bins left). Any
  shortfall (from rounding) is then added one at a time to the largest bins that still have room.

  Args:
    num: total budget.
    sizes: [B] bin sizes.

  Returns:
    [B] int64 budgets, budgets <= sizes, summing to min(num, sum(sizes)) in the usual case.
  """
  sizes = np.asarray(sizes, np.int64)
  order = np.argsort(sizes, kind="stable")
  sorted_sizes = sizes[order]
  rest = int(num)
  budgets = np.zeros_like(sorted_sizes)
  for i, s in enumerate(sorted_sizes):
    if s == 0:
      continue
    rest_bins = int(np.count_nonzero(sorted_sizes[i:]))
    cur = min(int(s), rest // rest_bins)
    budgets[i] = cur
    rest -= cur
  delta = int(num) - int(budgets.sum())
  i = 1
  while delta > 0 and i <= len(sizes):
    if budgets[-i] < sorted_sizes[-i]:
      budgets[-i] += 1
      delta -= 1
    i += 1
  out = np.zeros_like(budgets)
  out[order] = budgets
  return out


def hard_cutoff_mask(difficulty, rate: float) -> np.ndarray:
  """[N] bool: False for the int(rate * N) hardest examples (CCS / D2 'mis_ratio' cutoff), True else.

  Args:
    difficulty: [N] scores, higher = harder (for AUM pass -AUM or max(AUM) - AUM).
    rate: fraction of hardest examples to drop, in [0, 1).
  """
  difficulty = np.asarray(difficulty)
  if not (0.0 <= rate < 1.0):
    raise ValueError(f"hard_cutoff must be in [0, 1); got {rate}.")
  n = difficulty.shape[0]
  n_cut = int(rate * n)
  keep = np.ones(n, bool)
  if n_cut:
    keep[np.argsort(-difficulty, kind="stable")[:n_cut]] = False
  return keep


def score_strata(scores, num_strata: int, eligible=None) -> np.ndarray:
  """Equal-width score bins (CCS): [N] stratum ids in [0, num_strata), -1 for ineligible examples.

  Deviation: the official code widens the top edge by max * 1.0001 so the maximum falls in the last
  bin; here the maximum is put in the last bin explicitly (same bins for positive scores, and no empty
  top bin for negative ones).
  """
  scores = np.asarray(scores, np.float64)
  eligible = np.ones(scores.shape[0], bool) if eligible is None else np.asarray(eligible, bool)
  if not eligible.any():
    return np.full(scores.shape[0], -1)
  lo, hi = scores[eligible].min(), scores[eligible].max()
  step = (hi - lo) / num_strata if hi > lo else 1.0
  ids = np.clip(np.floor((scores - lo) / step).astype(np.int64), 0, num_strata - 1)
  return np.where(eligible, ids, -1)


def _top_by_group(priority, groups, quotas) -> np.ndarray:
  """Indices with the highest priority in each group, quotas[g] of them (ties: lower index first)."""
  priority, groups, quotas = np.asarray(priority), np.asarray(groups), np.asarray(quotas)
  idx = np.arange(priority.shape[0])
  valid = groups >= 0
  idx, pr, gr = idx[valid], priority[valid], groups[valid]
  order = np.lexsort((idx, -pr, gr))
  idx, gr = idx[order], gr[order]
  start = np.searchsorted(gr, gr, side="left")
  rank = np.arange(gr.shape[0]) - start
  return idx[rank < quotas[gr]]


def _class_groups(labels, eligible, budget: int) -> tuple[np.ndarray, np.ndarray]:
  """Groups = classes (or one group), budgets spread over classes by `bin_allocate`."""
  n = eligible.shape[0]
  if labels is None:
    return np.where(eligible, 0, -1), np.asarray([budget])
  labels = np.asarray(labels)
  if labels.shape != (n,):
    raise ValueError(f"labels must have shape [N] = ({n},); got {labels.shape}.")
  _, inv = np.unique(labels, return_inverse=True)
  groups = np.where(eligible, inv, -1)
  sizes = np.bincount(groups[groups >= 0], minlength=inv.max() + 1)
  return groups, bin_allocate(budget, sizes)


def _strata_groups(scores, labels, eligible, budget: int, num_strata: int) -> tuple[np.ndarray, np.ndarray]:
  """CCS strata (score bins, inside each class when labels are given) and their budgets."""
  cls, cls_budget = _class_groups(labels, eligible, budget)
  groups = np.full(eligible.shape[0], -1)
  quotas = []
  for c in range(cls_budget.shape[0]):
    in_c = cls == c
    ids = score_strata(scores, num_strata, in_c)
    sizes = np.bincount(ids[ids >= 0], minlength=num_strata)
    groups = np.where(in_c, c * num_strata + ids, groups)
    quotas.append(bin_allocate(int(cls_budget[c]), sizes))
  return groups, np.concatenate(quotas)


@functools.partial(jax.jit, static_argnames=("graph_mode", "forward", "message_floor", "block_size"),
                   compiler_options={"xla_cpu_use_fusion_emitters": False})
def _d2_program(senders, distances, receivers, starts, degrees, scores, budget, gamma_forward, gamma_reverse,
                eligible, groups, quotas, graph_mode: str, forward: bool, message_floor: float | None,
                block_size: int):
  # Forward message passing and the whole reverse selection loop in one compiled program (no eager op between
  # them: each would be a dispatch, and a compile for every new edge count). Edges are padded to a bucket with
  # receiver N (dropped by the segment sum) and neighbour index N (dropped by the selection's scatters); the
  # budget is traced and the picks padded to N, so one program serves every budget. XLA:CPU's elemental fusion
  # emitter compiles it ~2x faster than the default, at the same speed.
  n = scores.shape[0]
  rho = scores
  if forward:
    graph = graph_lib.GraphsTuple(nodes=None, edges=distances, senders=senders, receivers=receivers,
                                  n_node=np.asarray([n]), n_edge=np.asarray([senders.shape[0]]), globals=None)
    rho = mp.forward_message_passing(graph, scores, gamma_forward, graph_mode, message_floor)
  sel = mp.select_from_lists(senders, distances, starts, degrees, rho, budget, gamma_reverse, eligible=eligible,
                             groups=groups, quotas=quotas, block_size=block_size, out_size=n)
  return sel, rho


def d2_select(embeddings, scores, groups, quotas, k: int = 10, gamma_forward: float = 1.0,
              gamma_reverse: float = 0.1, graph_mode: str = "sum", squared: bool = False,
              message_floor: float | None = None, forward: bool = True, block_size: int | None = None,
              small_groups: str = "graph", key: jax.Array | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Graph + forward + reverse message passing over disjoint strata (one graph, one compiled loop).

  Because edges only join examples of the same group, running the loop once with per-group quotas gives
  exactly the per-stratum selections of the official code (each stratum's picks depend only on its
  own scores), in an interleaved order.

  Args:
    embeddings: [N, D]; scores: [N] difficulty (higher = harder).
    groups: [N] int stratum ids (-1 = excluded); quotas: [G] budgets.
    k, gamma_forward, gamma_reverse, graph_mode, squared, message_floor: see `knn_graph` and
      `forward_message_passing`.
    forward: run forward message passing (False selects on the raw scores: an ablation).
    block_size: argmax block size (None = auto).
    small_groups: 'graph' (default) runs D2 in every group, a group with <= k members gets a graph with
      fewer neighbours; 'random' matches the official code, which skips D2 for a stratum with at most
      `n_neighbor` members and draws its budget at random (`Coreset.stratified_sampling`).
    key: PRNG key of the random draws for small_groups='random' (default jax.random.key(0)).

  Returns:
    (selected [sum(quotas)] int indices, rho [N] updated scores).
  """
  groups = np.asarray(groups)
  quotas = np.asarray(quotas)
  counts = np.bincount(groups[groups >= 0], minlength=len(quotas))
  if small_groups not in ("graph", "random"):
    raise ValueError(f"unknown small_groups '{small_groups}'; choose 'graph' or 'random' (the official skip).")
  if np.asarray(embeddings).shape[0] <= 1:
    raise ValueError("D2 selection needs at least two examples.")
  picked_small = np.zeros((0,), np.int64)
  small = (counts > 0) & (counts <= k) & (quotas > 0)
  if small_groups == "random" and small.any():
    # Official skip: a stratum with <= k members is sampled at random (its budget), not by message passing.
    key = jax.random.key(0) if key is None else key
    draws = []
    for g in np.flatnonzero(small):
      members = np.flatnonzero(groups == g)
      perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, int(g)), members))
      draws.append(perm[:int(quotas[g])])
    picked_small = np.concatenate(draws).astype(np.int64)
    groups = np.where(small[np.maximum(groups, 0)] & (groups >= 0), -1, groups)
    quotas = np.where(small, 0, quotas)
    counts = np.where(small, 0, counts)
    if int(quotas.sum()) == 0:
      return picked_small, np.asarray(scores, np.float32)
  k_eff = int(min(k, max(int(counts.max(initial=1)) - 1, 1)))
  graph = dataset_graph.knn_graph(embeddings, k_eff, groups=groups, squared=squared)
  # CSR neighbour lists on the host (the edges come sorted by receiver, then sender): the same lists as
  # `message_passing.neighbour_lists`, without a device round trip per array.
  n = int(np.shape(scores)[0])
  senders, receivers = np.asarray(graph.senders, np.int32), np.asarray(graph.receivers, np.int32)
  e = senders.shape[0]
  degrees = np.bincount(receivers, minlength=n).astype(np.int32)
  starts = (np.cumsum(degrees) - degrees).astype(np.int32)
  e_pad = -(-max(e, 1) // 4096) * 4096  # padded edge count: fewer distinct compiled shapes
  pad = e_pad - e
  budget = int(quotas.sum())
  sel, rho = compile_cache.cached_call(_d2_program, np.pad(senders, (0, pad), constant_values=n),
                         np.pad(np.asarray(graph.edges, np.float32).reshape(-1), (0, pad)),
                         np.pad(receivers, (0, pad), constant_values=n), starts, degrees,
                         np.asarray(scores, np.float32), np.int32(budget), np.float32(gamma_forward),
                         np.float32(gamma_reverse), groups >= 0, np.maximum(groups, 0).astype(np.int32),
                         np.asarray(quotas, np.int32), graph_mode=graph_mode, forward=bool(forward),
                         message_floor=message_floor,
                         block_size=mp.auto_block_size(n, e / max(n, 1)) if block_size is None else block_size)
  sel = np.asarray(sel)[:budget]
  return np.concatenate([sel[sel >= 0], picked_small]), np.asarray(rho)


def kcenter_greedy(embeddings: jax.Array, budget: int, key: jax.Array, eligible: jax.Array | None = None,
                   groups: jax.Array | None = None, quotas: jax.Array | None = None) -> jax.Array:
  """Greedy k-center (farthest-point) selection; jittable with a static budget.

  Repeatedly picks the example farthest from its nearest selected center (Euclidean), i.e. the greedy
  2-approximation of the minimax facility location problem. The first center of each group is drawn at
  random (Sener & Savarese); the official code starts from index 0 (np.argmax(None)).

  Args:
    embeddings: [N, D] features.
    budget: number of centers (static).
    key: PRNG key for the random first center(s).
    eligible: optional [N] bool of selectable examples.
    groups, quotas: optional [N] group ids and [G] per-group budgets; distances to centers of other
      groups are ignored (per-class k-center, as the official class-stratified mode runs it).

  Returns:
    [budget] int32 indices in selection order (-1 where nothing eligible was left; empty for budget 0; all -1
    under jit for non-finite embeddings, which raise eagerly).
  """
  where = "d2pruning.kcenter_greedy"
  checks.shapes(where, embeddings=(embeddings, "N D"), eligible=(eligible, "N"), groups=(groups, "N"))
  budget = checks.static_int(where, "budget", budget, low=0)
  if budget == 0:
    return jnp.full((0,), -1, jnp.int32)
  ok = checks.finite(where, "embeddings", embeddings)
  return checks.poison(_kcenter_greedy(embeddings, budget, key, eligible, groups, quotas), ok, int_fill=-1)


def _kcenter_greedy(embeddings, budget, key, eligible, groups, quotas):
  x = jnp.asarray(embeddings, jnp.float32)
  n = x.shape[0]
  sq = jnp.sum(x * x, -1)
  big = jnp.float32(1e30)
  start = big * (1.0 + jax.random.uniform(key, (n,)))  # random first pick per group (ties impossible)
  min_d = start if eligible is None else jnp.where(eligible, start, -jnp.inf)
  if groups is not None:
    groups = jnp.asarray(groups, jnp.int32)
    quotas = jnp.asarray(quotas, jnp.int32)
    min_d = jnp.where(quotas[jnp.clip(groups, 0, quotas.shape[0] - 1)] > 0, min_d, -jnp.inf)
  remaining = quotas if groups is not None else jnp.zeros((1,), jnp.int32)

  def body(t, carry):
    min_d, remaining, out = carry
    u = jnp.argmax(min_d).astype(jnp.int32)
    ok = min_d[u] > -jnp.inf
    d = jnp.sqrt(jnp.maximum(sq - 2.0 * x @ x[u] + sq[u], 0.0))
    if groups is not None:
      d = jnp.where(groups == groups[u], d, jnp.inf)
    new = jnp.minimum(min_d, d)
    if groups is not None:
      remaining = remaining.at[groups[u]].add(jnp.where(ok, -1, 0))
      new = jnp.where((groups == groups[u]) & (remaining[groups[u]] <= 0), -jnp.inf, new)
    new = new.at[u].set(-jnp.inf)
    min_d = jnp.where(ok, new, min_d)
    return min_d, remaining, out.at[t].set(jnp.where(ok, u, -1))

  _, _, out = jax.lax.fori_loop(0, budget, body, (min_d, remaining, jnp.full((budget,), -1, jnp.int32)))
  return out


@functools.partial(jax.jit, static_argnames=("budget",))
def _kcenter_jit(x, budget, key, eligible, groups, quotas):
  return kcenter_greedy(x, budget, key, eligible, groups, quotas)


def _validate(embeddings, scores, labels, where: str = "d2pruning.select_coreset"):
  # select_coreset runs on the host: its inputs must be readable here (never a tracer or another host's array).
  checks.shapes(where, scores=(scores, "N"), embeddings=(embeddings, "N D"), labels=(labels, "N"))
  n = np.shape(scores)[0]
  checks.nonempty(where, "scores", n, "examples")
  if embeddings is not None:
    checks.finite(where, "embeddings", checks.host_array(where, "embeddings", embeddings))
  checks.finite(where, "scores", checks.host_array(where, "scores", scores), "difficulty scores must be finite.")
  return n


def select_coreset(embeddings, scores, fraction: float, method: str = "d2", key: jax.Array | None = None, *,
                   labels=None, k: int = 10, gamma_forward: float = 1.0, gamma_reverse: float = 0.1,
                   graph_mode: str = "sum", hard_cutoff: float = 0.0, cutoff_scores=None,
                   stratify: str | None = None, num_strata: int = 50, squared: bool = False,
                   message_floor: float | None = None, forward: bool = True,
                   small_groups: str = "graph") -> np.ndarray:
  """Selects a coreset of `fraction * N` examples.

  Args:
    embeddings: [N, D] example embeddings (used by 'd2' and 'kcenter').
    scores: [N] difficulty scores, higher = harder (forgetting, EL2N, max(AUM) - AUM, variance).
    fraction: fraction of the data KEPT, in (0, 1] (pruning rate = 1 - fraction).
    method: 'd2', 'random', 'difficulty', 'ccs' or 'kcenter'.
    key: PRNG key ('random', 'ccs', 'kcenter'); default jax.random.key(0).
    labels: optional [N] class labels: every method then selects per class with budgets spread over
      classes by `bin_allocate` (the official label-balanced / class modes).
    k: neighbours of the D2 graph (paper: 5 or 10).
    gamma_forward, gamma_reverse: D2 edge kernel rates (official: 1 and 0.1).
    graph_mode: D2 forward mode, 'sum' or 'product'.
    hard_cutoff: fraction of all examples removed first as too hard ('d2' and 'ccs'; CCS's beta,
      the official --mis-ratio), ranked by `cutoff_scores`.
    cutoff_scores: [N] difficulty used for the cutoff (official: AUM, i.e. pass max(AUM) - AUM);
      default `scores`.
    stratify: D2 strata: 'class' (default with labels; the official README command), 'score' (CCS
      score strata on the message-passed scores, then D2 inside each: the official 'stratified' mode
      with --graph-score), or 'none'.
    num_strata: CCS strata (official default 50).
    squared, message_floor: see `knn_graph` and `forward_message_passing`.
    forward: D2 only; False skips forward message passing (the reverse pass then starts from the raw
      difficulty scores): the paper's ablation of the forward pass.
    small_groups: D2 only; 'random' is the official skip of D2 for strata with <= k members (see
      `d2_select`), 'graph' (default) runs D2 there too.

  Returns:
    [budget] int64 indices into the N examples, distinct (selection order for 'd2' / 'kcenter').
  """
  where = "d2pruning.select_coreset"
  checks.choice(where, "method", method, METHODS, "selection method")
  checks.choice(where, "graph_mode", graph_mode, ("sum", "product"))
  for name, g in (("gamma_forward", gamma_forward), ("gamma_reverse", gamma_reverse)):
    checks.in_range(where, name, g, 0.0, None, hint="edge kernel rates exp(-gamma d) (official 1 and 0.1).")
  checks.static_int(where, "k", k, low=1)
  checks.static_int(where, "num_strata", num_strata, low=1)
  n = _validate(embeddings if method in ("d2", "kcenter") else None, scores, labels)
  budget = budget_of(fraction, n)
  key = jax.random.key(0) if key is None and method in ("random", "ccs", "kcenter") else key
  scores = np.asarray(scores, np.float64)
  if method in ("d2", "ccs") and hard_cutoff:
    cut = scores if cutoff_scores is None else np.asarray(cutoff_scores)
    if cut.shape != (n,):
      raise ValueError(f"cutoff_scores must have shape [N] = ({n},); got {cut.shape}.")
    eligible = hard_cutoff_mask(cut, hard_cutoff)
  else:
    eligible = np.ones(n, bool)
  if budget > int(eligible.sum()):
    raise ValueError(f"cannot keep {budget} examples (fraction {fraction}) after removing the hardest "
                     f"{hard_cutoff:.0%}: only {int(eligible.sum())} remain; lower hard_cutoff to <= 1 - fraction.")

  if method == "random":
    groups, quotas = _class_groups(labels, eligible, budget)
    prio = np.asarray(jax.random.uniform(key, (n,)))
    sel = _top_by_group(prio, groups, quotas)
    sel = sel[np.argsort(prio[sel])]
  elif method == "difficulty":
    groups, quotas = _class_groups(labels, eligible, budget)
    sel = _top_by_group(scores, groups, quotas)
    sel = sel[np.lexsort((sel, -scores[sel]))]
  elif method == "ccs":
    groups, quotas = _strata_groups(scores, labels, eligible, budget, num_strata)
    prio = np.asarray(jax.random.uniform(key, (n,)))
    sel = _top_by_group(prio, groups, quotas)
  elif method == "kcenter":
    groups, quotas = _class_groups(labels, eligible, budget)
    sel = np.asarray(_kcenter_jit(jnp.asarray(embeddings, jnp.float32), budget, key, jnp.asarray(groups >= 0),
                                  jnp.asarray(np.maximum(groups, 0), jnp.int32), jnp.asarray(quotas, jnp.int32)))
    sel = sel[sel >= 0]
  else:  # d2
    stratify = ("class" if labels is not None else "none") if stratify is None else stratify
    if stratify not in ("class", "score", "none"):
      raise ValueError(f"unknown stratify '{stratify}'; choose 'class', 'score' or 'none'.")
    opts = dict(k=k, gamma_forward=gamma_forward, gamma_reverse=gamma_reverse, graph_mode=graph_mode,
                squared=squared, message_floor=message_floor, forward=forward, small_groups=small_groups,
                key=key)
    if stratify == "score":
      # Official 'stratified' + --graph-score: strata on the message-passed scores of the whole (per-class)
      # graph, then a fresh per-stratum graph with those scores as importance.
      cls, _ = _class_groups(labels, eligible, budget)
      rho = np.asarray(forward_graph_scores(embeddings, scores, cls, k, gamma_forward, graph_mode, squared,
                                            message_floor))
      groups, quotas = _strata_groups(rho, labels, eligible, budget, num_strata)
      sel, _ = d2_select(embeddings, rho, groups, quotas, **opts)
    else:
      groups, quotas = (_class_groups(labels, eligible, budget) if stratify == "class"
                        else _class_groups(None, eligible, budget))
      sel, _ = d2_select(embeddings, scores, groups, quotas, **opts)
  sel = np.asarray(sel, np.int64)
  if sel.shape[0] < budget:  # official: fill up at random from the eligible rest
    key = jax.random.key(0) if key is None else key
    rest = np.setdiff1d(np.flatnonzero(eligible), sel)
    extra = np.asarray(jax.random.permutation(jax.random.fold_in(key, 1), rest))[:budget - sel.shape[0]]
    sel = np.concatenate([sel, extra])
  return sel


def forward_graph_scores(embeddings, scores, groups, k: int = 10, gamma: float = 1.0, mode: str = "sum",
                         squared: bool = False, message_floor: float | None = None) -> jax.Array:
  """Forward message passing scores rho [N] on the kNN graph within groups (-1 = no edges)."""
  groups = np.asarray(groups)
  counts = np.bincount(groups[groups >= 0])
  k_eff = int(min(k, max(int(counts.max(initial=1)) - 1, 1)))
  graph = dataset_graph.knn_graph(embeddings, k_eff, groups=groups, squared=squared)
  return mp.forward_message_passing(graph, jnp.asarray(scores, jnp.float32), gamma, mode, message_floor)
