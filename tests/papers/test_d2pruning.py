"""Tests for D2 Pruning (iclr24_jax.papers.d2pruning): message passing, selection, baselines, scores, runs."""
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import graph as graph_lib
from iclr24_jax.configs import d2pruning as cfg_mod
from iclr24_jax.papers import d2pruning
from iclr24_jax.papers.d2pruning import scores as scores_lib, selection

LN2 = float(np.log(2.0))


def _five_node_graph():
  """Path graph 0-1-2-3-4 with distances d01 = 0, d12 = ln 2, d23 = 0, d34 = ln 2 (both directions)."""
  und = [(0, 1, 0.0), (1, 2, LN2), (2, 3, 0.0), (3, 4, LN2)]
  snd, rcv, dist = [], [], []
  for a, b, d in und:
    snd += [a, b]
    rcv += [b, a]
    dist += [d, d]
  return graph_lib.graph_from_edges(snd, rcv, 5, nodes=np.zeros((5, 1), np.float32),
                                    edges=np.asarray(dist, np.float32)[:, None])


SCORES5 = np.asarray([1.0, 2.0, 3.0, 0.0, 4.0], np.float32)


def test_forward_message_passing_five_nodes_by_hand():
  g = _five_node_graph()
  # gamma_f = 1: edge kernels exp(-0) = 1 and exp(-ln 2) = 0.5; w_ij = k_ij * s_j.
  # rho_0 = 1 + 1*2              = 3
  # rho_1 = 2 + 1*1 + 0.5*3      = 4.5
  # rho_2 = 3 + 0.5*2 + 1*0      = 4
  # rho_3 = 0 + 1*3 + 0.5*4      = 5
  # rho_4 = 4 + 0.5*0            = 4
  rho = d2pruning.forward_message_passing(g, jnp.asarray(SCORES5), gamma=1.0, mode="sum")
  np.testing.assert_allclose(np.asarray(rho), [3.0, 4.5, 4.0, 5.0, 4.0], rtol=1e-6)
  # product: rho_i = s_i * sum_j w_ij = [1*2, 2*(1+1.5), 3*(1+0), 0*(3+2), 4*0] = [2, 5, 3, 0, 0]
  rho_p = d2pruning.forward_message_passing(g, jnp.asarray(SCORES5), gamma=1.0, mode="product")
  np.testing.assert_allclose(np.asarray(rho_p), [2.0, 5.0, 3.0, 0.0, 0.0], rtol=1e-6)
  # gamma_f = 2 halves the kernel exponent scale: exp(-2 ln 2) = 0.25 -> rho_1 = 2 + 1 + 0.25*3 = 3.75
  rho_g = d2pruning.forward_message_passing(g, jnp.asarray(SCORES5), gamma=2.0)
  np.testing.assert_allclose(float(rho_g[1]), 3.75, rtol=1e-6)


@pytest.mark.parametrize("block_size", [0, 2])
def test_reverse_message_passing_five_nodes_by_hand(block_size):
  g = _five_node_graph()
  rho = jnp.asarray([3.0, 4.5, 4.0, 5.0, 4.0])  # the forward pass above
  # gamma_r = 1 (kernels 1 and 0.5):
  # pick 3 (5):   rho_2 = 4 - 1*5 = -1,      rho_4 = 4 - 0.5*5 = 1.5   -> [3, 4.5, -1, x, 1.5]
  # pick 1 (4.5): rho_0 = 3 - 1*4.5 = -1.5,  rho_2 = -1 - 0.5*4.5 = -3.25 -> [-1.5, x, -3.25, x, 1.5]
  # pick 4 (1.5), then 0 (-1.5), then 2 (-3.25). Node 2 started 3rd-highest but lies next to 3 and 1.
  sel = d2pruning.reverse_message_passing_select(g, rho, 5, gamma=1.0, block_size=block_size)
  assert np.asarray(sel).tolist() == [3, 1, 4, 0, 2]
  sel3 = d2pruning.reverse_message_passing_select(g, rho, 3, gamma=1.0, block_size=block_size)
  assert np.asarray(sel3).tolist() == [3, 1, 4]


def _official_dense_select(x, s, budget, k, gamma_r):
  """The official GraphDensitySampler (graph_mode='sum', 'weighted'), re-derived in numpy as a reference."""
  n = x.shape[0]
  dist = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
  d_ = dist.copy()
  np.fill_diagonal(d_, np.inf)
  knn = np.argsort(d_, axis=1, kind="stable")[:, :k]
  adj = np.zeros((n, n), bool)
  for i in range(n):
    adj[i, knn[i]] = True
  adj = adj | adj.T
  w = np.where(adj, np.exp(-dist) * s[None, :], 0.0)
  dens = w.sum(1) + s
  chosen = []
  for _ in range(budget):
    u = int(np.argmax(dens))
    nb = np.flatnonzero(adj[u])
    dens[nb] -= np.exp(-gamma_r * dist[u, nb]) * dens[u]
    chosen.append(u)
    dens[chosen] = dens.min() - 1.0
  return np.asarray(chosen)


@pytest.mark.parametrize("block_size,chunk", [(0, 16), (8, 16), (8, 3)])
def test_d2_matches_official_dense_algorithm(block_size, chunk):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(80, 4)).astype(np.float32)
  s = (rng.random(80) * 3).astype(np.float32)
  g = d2pruning.knn_graph(x, 6)
  rho = d2pruning.forward_message_passing(g, jnp.asarray(s), gamma=1.0)
  assert d2pruning.max_degree(g) > chunk or chunk == 16  # chunk=3: several inner update steps per pick
  ours = d2pruning.reverse_message_passing_select(g, rho, 40, gamma=0.3, block_size=block_size, chunk=chunk)
  ref = _official_dense_select(x.astype(np.float64), s.astype(np.float64), 40, 6, 0.3)
  np.testing.assert_array_equal(np.asarray(ours), ref)


def test_select_coreset_d2_equals_the_official_dense_algorithm():
  # End to end (the one-program path of select_coreset): the official sampler's picks, in its order, at a size
  # where the blocked two-level argmax is on (N >= 1,024).
  rng = np.random.default_rng(5)
  x = rng.normal(size=(1100, 6)).astype(np.float32)
  s = rng.random(1100).astype(np.float32)
  ours = selection.select_coreset(x, s, 0.2, method="d2", k=5, gamma_reverse=0.1)
  ref = _official_dense_select(x.astype(np.float64), s.astype(np.float64), 220, 5, 0.1)
  np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("mode,forward", [("sum", True), ("product", True), ("sum", False)])
def test_d2_select_equals_the_public_functions_composed(mode, forward):
  # d2_select fuses forward and reverse message passing into one compiled program over host-built neighbour
  # lists: the same picks and the same rho, bit for bit, as knn_graph -> forward_message_passing ->
  # reverse_message_passing_select with per-group quotas.
  rng = np.random.default_rng(1)
  n = 700
  x = rng.normal(size=(n, 8)).astype(np.float32)
  s = rng.random(n).astype(np.float32)
  groups = rng.integers(-1, 3, n)
  quotas = np.array([60, 40, 50])
  sel, rho = selection.d2_select(x, s, groups, quotas, k=6, gamma_reverse=0.3, graph_mode=mode, forward=forward)
  g = d2pruning.knn_graph(x, 6, groups=groups)
  rho_ref = d2pruning.forward_message_passing(g, jnp.asarray(s), 1.0, mode) if forward else jnp.asarray(s)
  ref = d2pruning.reverse_message_passing_select(g, rho_ref, int(quotas.sum()), 0.3, eligible=jnp.asarray(groups >= 0),
                                                 groups=jnp.asarray(np.maximum(groups, 0)),
                                                 quotas=jnp.asarray(quotas))
  np.testing.assert_array_equal(sel, np.asarray(ref))
  np.testing.assert_array_equal(rho, np.asarray(rho_ref))


def test_reverse_select_is_jittable_never_repeats_and_respects_budget():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(120, 5)).astype(np.float32)
  g = d2pruning.knn_graph(x, 5)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def select(senders, receivers, edges, s):
    graph = g._replace(senders=senders, receivers=receivers, edges=edges)
    return d2pruning.reverse_message_passing_select(graph, s, 100, gamma=0.1)

  for seed in range(3):
    s = jnp.asarray(np.random.default_rng(seed).random(120), jnp.float32)
    out = np.asarray(select(g.senders, g.receivers, g.edges, s))
    chex.assert_shape(out, (100,))
    assert out.dtype == np.int32
    assert len(set(out.tolist())) == 100 and out.min() >= 0 and out.max() < 120
  eligible = np.arange(120) % 3 != 0  # 80 eligible
  out = np.asarray(d2pruning.reverse_message_passing_select(g, s, 80, eligible=jnp.asarray(eligible)))
  assert set(out.tolist()) == set(np.flatnonzero(eligible).tolist())


def test_quotas_over_disjoint_groups_equal_separate_runs():
  rng = np.random.default_rng(2)
  x = rng.normal(size=(90, 3)).astype(np.float32)
  s = rng.random(90).astype(np.float32)
  groups = rng.permutation(np.repeat([0, 1, 2], 30))  # equal sizes: the three separate runs share one compile
  quotas = np.asarray([7, 11, 5])
  joint, _ = selection.d2_select(x, s, groups, quotas, k=4, gamma_reverse=0.5)
  for gid in range(3):
    members = np.flatnonzero(groups == gid)
    sub, _ = selection.d2_select(x[members], s[members], np.zeros(len(members), int), quotas[gid:gid + 1], k=4,
                                 gamma_reverse=0.5)
    mine = [i for i in joint if groups[i] == gid]  # per-group order is preserved in the interleaving
    assert mine == members[sub].tolist()


def test_official_small_group_skip_draws_at_random_and_keeps_d2_elsewhere():
  rng = np.random.default_rng(5)
  x = rng.normal(size=(40, 3)).astype(np.float32)
  s = rng.random(40).astype(np.float32)
  groups = np.repeat([0, 1], [36, 4])  # group 1 has 4 <= k = 5 members: the official code skips D2 there
  quotas = np.asarray([9, 2])
  official, _ = selection.d2_select(x, s, groups, quotas, k=5, small_groups="random", key=jax.random.key(3))
  ours, _ = selection.d2_select(x, s, groups, quotas, k=5)
  big = np.flatnonzero(groups == 0)
  sub, _ = selection.d2_select(x[big], s[big], np.zeros(36, int), quotas[:1], k=5)
  assert [i for i in official if groups[i] == 0] == big[sub].tolist()  # D2 unchanged in the large group
  small_pick = [i for i in official if groups[i] == 1]
  assert len(small_pick) == 2 and len(set(small_pick)) == 2
  # the official draw: a keyed random permutation of the small group, cut at its quota
  perm = np.asarray(jax.random.permutation(jax.random.fold_in(jax.random.key(3), 1), np.flatnonzero(groups == 1)))
  assert small_pick == perm[:2].tolist()
  assert len(ours) == 11 and sum(groups[i] == 1 for i in ours) == 2


def test_d2_without_forward_pass_selects_on_raw_scores():
  rng = np.random.default_rng(6)
  x = rng.normal(size=(50, 3)).astype(np.float32)
  s = rng.random(50).astype(np.float32)
  g = d2pruning.knn_graph(x, 5)
  want = np.asarray(d2pruning.reverse_message_passing_select(g, jnp.asarray(s), 10, 0.1))
  got = d2pruning.select_coreset(x, s, 0.2, "d2", forward=False, k=5, gamma_reverse=0.1)
  assert got.tolist() == want.tolist()
  with_fwd = d2pruning.select_coreset(x, s, 0.2, "d2", k=5, gamma_reverse=0.1)
  rho = d2pruning.forward_message_passing(g, jnp.asarray(s), 1.0, "sum")
  assert with_fwd.tolist() == np.asarray(d2pruning.reverse_message_passing_select(g, rho, 10, 0.1)).tolist()


def _brute_knn(x, k, groups=None):
  d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
  np.fill_diagonal(d, np.inf)
  if groups is not None:
    d = np.where(groups[:, None] == groups[None, :], d, np.inf)
  idx = np.argsort(d, axis=1, kind="stable")[:, :k]
  return np.sqrt(np.take_along_axis(d, idx, 1)), idx


@pytest.mark.parametrize("use_groups", [False, True])
@pytest.mark.parametrize("symmetric", [True, False])
def test_knn_graph_equals_brute_force(use_groups, symmetric):
  rng = np.random.default_rng(3)
  x = rng.normal(size=(60, 4)).astype(np.float32)
  groups = rng.integers(0, 3, 60) if use_groups else None
  g = d2pruning.knn_graph(x, 4, groups=groups, symmetric=symmetric)
  bd, bi = _brute_knn(x.astype(np.float64), 4, groups)
  want = {}
  for i in range(60):
    for j, d in zip(bi[i], bd[i]):
      want[(int(j), i)] = d  # sender j -> receiver i
      if symmetric:
        want[(i, int(j))] = d
  got = {(int(a), int(b)): float(e) for a, b, e in zip(g.senders, g.receivers, np.asarray(g.edges)[:, 0])}
  assert set(got) == set(want)
  np.testing.assert_allclose([got[e] for e in sorted(want)], [want[e] for e in sorted(want)], rtol=1e-4, atol=1e-4)
  assert np.all(np.diff(np.asarray(g.receivers)) >= 0)  # sorted by receiver
  if use_groups:
    assert np.all(groups[np.asarray(g.senders)] == groups[np.asarray(g.receivers)])


def test_neighbour_table_lists_every_edge():
  g = _five_node_graph()
  nbr, dist = d2pruning.neighbour_table(g, d2pruning.max_degree(g))
  rows = {i: sorted(int(j) for j in np.asarray(nbr[i]) if j < 5) for i in range(5)}
  assert rows == {0: [1], 1: [0, 2], 2: [1, 3], 3: [2, 4], 4: [3]}
  assert np.isinf(np.asarray(dist[0, 1]))  # padding entry
  with pytest.raises(ValueError, match="k_max"):
    d2pruning.neighbour_table(g, 1)


def test_padding_does_not_change_results():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(50, 3)).astype(np.float32)
  s = rng.random(50).astype(np.float32)
  g = d2pruning.knn_graph(x, 4)
  padded = graph_lib.pad_to_budget(g, n_node=64, n_edge=int(g.n_edge[0]) + 37, n_graph=3)
  mask = graph_lib.node_mask(padded)
  s_pad = jnp.concatenate([jnp.asarray(s), jnp.full((14,), 5.0)])  # large padding scores must not matter
  rho = d2pruning.forward_message_passing(g, jnp.asarray(s))
  rho_pad = d2pruning.forward_message_passing(padded, s_pad)
  np.testing.assert_allclose(np.asarray(rho_pad[:50]), np.asarray(rho), rtol=1e-6)
  sel = d2pruning.reverse_message_passing_select(g, rho, 30)
  sel_pad = d2pruning.reverse_message_passing_select(padded, rho_pad, 30, node_mask=mask)
  np.testing.assert_array_equal(np.asarray(sel_pad), np.asarray(sel))
  nbr, dist = d2pruning.neighbour_table(g, d2pruning.max_degree(g))  # the padded-table form: same picks
  np.testing.assert_array_equal(np.asarray(d2pruning.select_from_table(nbr, dist, rho, 30, 0.1)), np.asarray(sel))


def _numpy_kcenter(x, first, budget):
  chosen = [first]
  dmin = np.sqrt(((x - x[first]) ** 2).sum(-1))
  for _ in range(budget - 1):
    u = int(np.argmax(dmin))
    chosen.append(u)
    dmin = np.minimum(dmin, np.sqrt(((x - x[u]) ** 2).sum(-1)))
  return np.asarray(chosen), dmin.max()


def test_kcenter_is_farthest_first_and_respects_class_quotas():
  rng = np.random.default_rng(5)
  x = rng.normal(size=(70, 3)).astype(np.float32)
  out = np.asarray(d2pruning.kcenter_greedy(jnp.asarray(x), 15, jax.random.key(0)))
  ref, radius = _numpy_kcenter(x.astype(np.float64), int(out[0]), 15)
  np.testing.assert_array_equal(out, ref)
  # greedy k-center: every example lies within the covering radius of some center
  d = np.sqrt(((x[:, None] - x[out][None]) ** 2).sum(-1)).min(1)
  assert d.max() <= radius + 1e-5
  starts = {int(d2pruning.kcenter_greedy(jnp.asarray(x), 1, jax.random.key(i))[0]) for i in range(5)}
  assert len(starts) > 1  # the first center is random (the official code always starts at index 0)
  labels = rng.integers(0, 3, 70)
  sel = d2pruning.select_coreset(x, rng.random(70), 0.3, "kcenter", jax.random.key(0), labels=labels)
  budgets = d2pruning.bin_allocate(21, np.bincount(labels))
  np.testing.assert_array_equal(np.bincount(labels[sel], minlength=3), budgets)


def test_random_baseline_is_class_balanced_and_seeded():
  rng = np.random.default_rng(6)
  labels = np.repeat([0, 1, 2], [50, 30, 20])
  s, x = rng.random(100), rng.normal(size=(100, 2))
  a = d2pruning.select_coreset(x, s, 0.4, "random", jax.random.key(0), labels=labels)
  b = d2pruning.select_coreset(x, s, 0.4, "random", jax.random.key(0), labels=labels)
  c = d2pruning.select_coreset(x, s, 0.4, "random", jax.random.key(1), labels=labels)
  assert len(a) == 40 and len(set(a.tolist())) == 40
  np.testing.assert_array_equal(a, b)
  assert set(a.tolist()) != set(c.tolist())
  # bin_allocate over class sizes [50, 30, 20] for 40: smallest first 40//3 = 13, then 27//2 = 13, then 14
  np.testing.assert_array_equal(np.bincount(labels[a]), [14, 13, 13])
  unbalanced = d2pruning.select_coreset(x, s, 0.4, "random", jax.random.key(0))
  assert len(set(unbalanced.tolist())) == 40


def test_difficulty_baseline_takes_the_hardest():
  s = np.asarray([0.1, 0.9, 0.5, 0.7, 0.3, 0.8])
  out = d2pruning.select_coreset(None, s, 0.5, "difficulty")
  assert out.tolist() == [1, 5, 3]


def test_bin_allocate_and_ccs_cutoff_and_strata():
  # sizes [5, 1, 10, 0], budget 9: visit sizes 0, 1, 5, 10 -> 0; min(1, 9//3)=1; min(5, 8//2)=4; min(10, 4)=4
  np.testing.assert_array_equal(d2pruning.bin_allocate(9, [5, 1, 10, 0]), [4, 1, 4, 0])
  np.testing.assert_array_equal(d2pruning.bin_allocate(5, [1, 1]), [1, 1])  # more budget than data
  s = np.arange(20, dtype=float)  # difficulty = index
  keep = d2pruning.hard_cutoff_mask(s, 0.2)
  assert np.flatnonzero(~keep).tolist() == [16, 17, 18, 19]
  ids = d2pruning.score_strata(s, 4, keep)  # 0..15 in 4 equal-width bins of width 3.75
  assert ids[:16].tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 and (ids[16:] == -1).all()
  sel = d2pruning.select_coreset(None, s, 0.4, "ccs", jax.random.key(0), hard_cutoff=0.2, num_strata=4)
  assert len(sel) == 8 and max(sel) < 16
  np.testing.assert_array_equal(np.bincount(ids[sel], minlength=4), [2, 2, 2, 2])


def test_select_coreset_d2_with_classes_and_cutoff():
  rng = np.random.default_rng(7)
  x = rng.normal(size=(200, 6)).astype(np.float32)
  s = rng.random(200)
  labels = rng.integers(0, 4, 200)
  cut = rng.random(200)
  out = d2pruning.select_coreset(x, s, 0.5, "d2", labels=labels, k=5, hard_cutoff=0.2, cutoff_scores=cut)
  assert len(out) == 100 and len(set(out.tolist())) == 100
  assert d2pruning.hard_cutoff_mask(cut, 0.2)[out].all()
  keep = d2pruning.hard_cutoff_mask(cut, 0.2)
  np.testing.assert_array_equal(np.bincount(labels[out], minlength=4),
                                d2pruning.bin_allocate(100, np.bincount(labels[keep], minlength=4)))
  out_s = d2pruning.select_coreset(x, s, 0.5, "d2", labels=labels, k=5, stratify="score", num_strata=5)
  assert len(set(out_s.tolist())) == 100


def test_example_stats_by_hand():
  # logits [0, ln 3] -> softmax [0.25, 0.75]; label 0: p_gold 0.25, wrong, margin 0.25 - 0.75 = -0.5,
  # el2n = ||[0.25 - 1, 0.75]|| = sqrt(0.5625 + 0.5625) = 1.06066
  st = d2pruning.example_stats(jnp.asarray([[0.0, np.log(3.0)]]), jnp.asarray([0]))
  np.testing.assert_allclose(float(st["p_gold"][0]), 0.25, rtol=1e-6)
  assert not bool(st["correct"][0])
  np.testing.assert_allclose(float(st["margin"][0]), -0.5, rtol=1e-6)
  np.testing.assert_allclose(float(st["el2n"][0]), np.sqrt(1.125), rtol=1e-6)


def test_scores_from_dynamics_by_hand():
  dyn = {"correct": np.asarray([[1, 0], [0, 1], [1, 1], [0, 1]], bool),  # [E=4, N=2]
         "p_gold": np.asarray([[0.6, 0.2], [0.4, 0.6], [0.6, 0.8], [0.4, 0.8]]),
         "margin": np.asarray([[0.2, -0.5], [-0.1, 0.3], [0.3, 0.7], [-0.2, 0.7]]),
         "el2n": np.asarray([[0.5, 1.0], [0.7, 0.5], [0.4, 0.2], [0.9, 0.2]])}
  sc = d2pruning.scores_from_dynamics(dyn, el2n_epochs=2)
  # example 0 is correct, wrong, correct, wrong: forgotten twice; example 1 is learned once, never forgotten
  np.testing.assert_array_equal(sc["forgetting"], [2, 0])
  np.testing.assert_allclose(sc["aum"], [0.2 - 0.1 + 0.3 - 0.2, -0.5 + 0.3 + 0.7 + 0.7], rtol=1e-6)
  np.testing.assert_allclose(sc["el2n"], [0.5 + 0.7, 1.0 + 0.5], rtol=1e-6)
  # variance of [0.6, 0.4, 0.6, 0.4] = 0.01; of [0.2, 0.6, 0.8, 0.8]: mean 0.6, (0.16+0+0.04+0.04)/4 = 0.06
  np.testing.assert_allclose(sc["variance"], [0.01, 0.06], rtol=1e-6)
  np.testing.assert_allclose(d2pruning.as_difficulty(sc, "aum"), [1.2 - 0.2, 0.0], atol=1e-6)


@pytest.fixture(scope="module")
def digits_small():
  from iclr24_jax.common import data as data_lib
  ds = data_lib.load_digits()
  return ds


def _tiny_cfg():
  from iclr24_jax.configs import d2pruning as cfg_mod
  return cfg_mod.get_config("tiny")


def test_train_step_lowers_loss_compiled_once(digits_small):
  from iclr24_jax.papers.d2pruning import model as model_lib
  from iclr24_jax.vision import classify
  cfg = _tiny_cfg()
  model, tx = model_lib.create_classifier(cfg, 10, 100)
  state = classify.init(jax.random.key(0), model, digits_small.input_shape, tx)
  batch = {"x": jnp.asarray(digits_small.train.x[:64]), "y": jnp.asarray(digits_small.train.y[:64]),
           "mask": jnp.ones(64)}
  step = jax.jit(chex.assert_max_traces(scores_lib.make_train_step(model), n=1))
  losses = []
  for _ in range(15):
    state, metrics, stats = step(state, batch, jax.random.key(1))
    losses.append(float(metrics["loss"]))
  chex.assert_shape(stats["p_gold"], (64,))
  assert losses[-1] < losses[0] - 0.3


def test_dynamics_trainer_shapes(digits_small):
  from iclr24_jax.papers.d2pruning import model as model_lib
  cfg = _tiny_cfg()
  model, tx = model_lib.create_classifier(cfg, 10, 6)
  train = jax.jit(d2pruning.make_dynamics_trainer(model, tx, digits_small.input_shape, 3, 64))
  x, y = digits_small.train.x[:150], digits_small.train.y[:150]  # 150 = 2 full batches + 22 (padded)
  state, dyn, metrics = train(jax.random.key(0), x, y)
  for k in ("p_gold", "correct", "margin", "el2n"):
    chex.assert_shape(dyn[k], (3, 150))
  chex.assert_shape(metrics["loss"], (3,))
  assert int(state.step) == 9
  assert np.all((np.asarray(dyn["p_gold"]) > 0) & (np.asarray(dyn["p_gold"]) < 1))  # every example visited


def test_coreset_training_same_on_1_and_8_devices(digits_small):
  from iclr24_jax.common import sharding
  from iclr24_jax.papers.d2pruning import experiment
  cfg = _tiny_cfg()
  cfg.num_steps = 10
  coresets = [np.arange(i * 50, i * 50 + 100) for i in range(8)]
  one = experiment.train_coresets(cfg, digits_small, coresets, jax.random.key(0),
                                  mesh=sharding.make_mesh(devices=jax.devices()[:1]))
  eight = experiment.train_coresets(cfg, digits_small, coresets, jax.random.key(0),
                                    mesh=sharding.make_mesh(devices=jax.devices()[:8]))
  np.testing.assert_allclose(one["final_loss"], eight["final_loss"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(one["test_accuracy"], eight["test_accuracy"], atol=1e-6)


def test_coreset_runs_with_the_same_seed_share_the_training_key(digits_small):
  from iclr24_jax.common import sharding
  from iclr24_jax.papers.d2pruning import experiment
  cfg = _tiny_cfg()
  cfg.num_steps = 5
  same = [np.arange(200)] * 4
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  out = experiment.train_coresets(cfg, digits_small, same, jax.random.key(0), mesh=mesh, seeds=[0, 1, 0, 1])
  np.testing.assert_allclose(out["final_loss"][0], out["final_loss"][2], rtol=1e-6)  # paired by seed: identical
  assert out["final_loss"][0] != out["final_loss"][1]  # another seed: another initialisation


def test_experiment_tiny_run(tmp_path):
  from iclr24_jax.papers.d2pruning import experiment
  res = experiment.run(_tiny_cfg(), str(tmp_path))
  assert set(res["accuracy"]) == {"d2", "d2_nofwd", "random", "ccs", "kcenter", "difficulty"}
  assert set(res["accuracy"]["d2"]) == {"0.5", "0.9"}
  assert os.path.exists(tmp_path / "results.json") and os.path.exists(tmp_path / "metrics.jsonl")
  for p in res["plots"]:
    assert os.path.exists(p)
  assert 0.0 <= res["accuracy"]["d2"]["0.5"]["mean"] <= 1.0
  assert set(res["d2_gamma_reverse_chosen"]) == {"0.5", "0.9"}


def test_clear_errors():
  x = np.zeros((10, 2), np.float32)
  with pytest.raises(ValueError, match="unknown selection method"):
    d2pruning.select_coreset(x, np.zeros(10), 0.5, "herding")
  with pytest.raises(ValueError, match="fraction"):
    d2pruning.select_coreset(x, np.zeros(10), 0.0, "random")
  with pytest.raises(ValueError, match="NaN"):
    d2pruning.select_coreset(x, np.full(10, np.nan), 0.5, "random")
  with pytest.raises(ValueError, match=r"embeddings must be \[N, D\]"):
    d2pruning.select_coreset(np.zeros((9, 2)), np.zeros(10), 0.5, "d2")
  with pytest.raises(ValueError, match="hard_cutoff"):
    d2pruning.select_coreset(x, np.arange(10.0), 0.8, "ccs", hard_cutoff=0.5)
  with pytest.raises(ValueError, match="only 9 other"):
    d2pruning.knn_graph(x, 10)
  with pytest.raises(ValueError, match="2-D"):
    d2pruning.knn_graph(np.zeros(10), 2)
  g = _five_node_graph()
  with pytest.raises(ValueError, match="budget 6 exceeds"):
    d2pruning.reverse_message_passing_select(g, jnp.asarray(SCORES5), 6)
  with pytest.raises(ValueError, match="graph has 5 nodes"):
    d2pruning.forward_message_passing(g, jnp.zeros(4))
  with pytest.raises(ValueError, match="mode"):
    d2pruning.forward_message_passing(g, jnp.asarray(SCORES5), mode="max")
  from iclr24_jax.configs import d2pruning as cfg_mod
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("cifar10")


def test_config_variants():
  from iclr24_jax.configs import d2pruning as cfg_mod
  for v in cfg_mod.VARIANTS:
    c = cfg_mod.get_config(v)
    assert c.paper == "d2pruning" and len(c.selection.hard_cutoff) == len(c.selection.pruning_rates)
  assert cfg_mod.get_config("mnist5k").data.name == "mnist5k"


def test_text_embedder_optional():
  from iclr24_jax.papers.d2pruning import text
  try:
    embed = text.load_text_embedder()
  except text.TextEmbedderUnavailable as e:
    pytest.skip(f"lm core MiniLM embedder unavailable: {e}")
  emb = embed(["Can a cat swim?", "Is the sky green?"])
  chex.assert_shape(emb, (2, 384))


@pytest.mark.slow
def test_reproduce_fast_rows(tmp_path):
  from iclr24_jax.papers.d2pruning import study
  rows = study.reproduce(str(tmp_path), fast=True, get_config=cfg_mod.get_config)
  assert rows and all({"paper", "experiment", "metric", "ours", "paper_value", "holds"} <= set(r) for r in rows)
