"""D2 Pruning selection (`papers/d2pruning/selection.py`): D2 against the official dense algorithm, group quotas,
k-center, random and difficulty baselines, CCS bins, clear errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import d2pruning
from iclr24_jax.papers.d2pruning import selection
from .helpers import SCORES5, _five_node_graph, _official_dense_select


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
