"""Replay buffers: ring semantics, sampling frequencies (uniform and proportional), the sum-tree, IS weights."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.rl import replay


def _bound(n, p, sigmas=5.0):
  """|count - n p| allowed: `sigmas` binomial standard deviations."""
  return sigmas * np.sqrt(n * p * (1 - p))


def test_uniform_ring_buffer_overwrites_oldest():
  buf = replay.uniform_init({"x": jnp.zeros(2), "i": jnp.zeros((), jnp.int32)}, capacity=5)
  for start in (0, 3, 6):
    items = {"x": jnp.ones((3, 2)) * start, "i": jnp.arange(start, start + 3, dtype=jnp.int32)}
    buf = replay.uniform_add(buf, items)
  # 9 items written into 5 slots: slots hold items 5..8 and 4: [5, 6, 7, 8, 4] after wrap-around
  np.testing.assert_array_equal(buf.data["i"], [5, 6, 7, 8, 4])
  assert int(buf.size) == 5 and int(buf.insert) == 4
  with pytest.raises(ValueError, match="at most capacity"):
    replay.uniform_add(buf, {"x": jnp.zeros((6, 2)), "i": jnp.zeros(6, jnp.int32)})
  with pytest.raises(ValueError, match="different leading sizes"):
    replay.uniform_add(buf, {"x": jnp.zeros((2, 2)), "i": jnp.zeros(3, jnp.int32)})


def test_uniform_sampling_frequencies():
  buf = replay.uniform_init(jnp.zeros((), jnp.int32), capacity=16)
  buf = replay.uniform_add(buf, jnp.arange(10, dtype=jnp.int32))  # 10 of 16 slots filled
  n = 100_000
  draws = np.asarray(jax.jit(replay.uniform_sample, static_argnums=2)(buf, jax.random.key(0), n))
  counts = np.bincount(draws, minlength=16)
  assert counts[10:].sum() == 0  # never the empty slots
  assert np.all(np.abs(counts[:10] - n / 10) < _bound(n, 0.1))


def test_sum_tree_find_matches_searchsorted():
  buf = replay.prioritized_init(jnp.zeros(()), capacity=6, alpha=1.0)
  pr = jnp.array([0.5, 2.0, 1.0, 3.0, 0.25, 1.25])
  buf = replay.prioritized_add(buf, jnp.arange(6.0), priorities=pr)
  np.testing.assert_allclose(buf.total, float(pr.sum()), rtol=1e-6)
  u = jnp.linspace(0.0, float(pr.sum()) - 1e-3, 97)
  idx = replay.sum_tree_find(buf.tree, u, buf.num_leaves)
  np.testing.assert_array_equal(idx, np.searchsorted(np.cumsum(np.asarray(pr)), np.asarray(u), side="right"))


def test_prioritized_sampling_frequencies_and_weights():
  # priorities (1, 2, 3, 4) with alpha = 1 -> P = (0.1, 0.2, 0.3, 0.4)
  buf = replay.prioritized_init(jnp.zeros((), jnp.int32), capacity=4, alpha=1.0)
  buf = replay.prioritized_add(buf, jnp.arange(4, dtype=jnp.int32), priorities=jnp.array([1.0, 2.0, 3.0, 4.0]))
  sample = jax.jit(replay.prioritized_sample, static_argnums=2)
  batch, n_rep = 1000, 50
  counts = np.zeros(4)
  for r in range(n_rep):
    items, idx, w = sample(buf, jax.random.key(r), batch)
    np.testing.assert_array_equal(items, idx)
    counts += np.bincount(np.asarray(idx), minlength=4)
  n = batch * n_rep
  p = np.array([0.1, 0.2, 0.3, 0.4])
  assert np.all(np.abs(counts - n * p) < _bound(n, p))
  # IS weights (N P_i)^-beta / max: with beta = 1: (1/(4 * 0.1)) / (1/(4 * 0.1)) = 1 for item 0, 0.25 for item 3
  _, idx, w = replay.prioritized_sample(buf, jax.random.key(0), 8, beta=1.0)
  expected = (4 * p[np.asarray(idx)]) ** -1.0
  np.testing.assert_allclose(w, expected / expected.max(), rtol=1e-5)


def test_prioritized_update_and_new_items_get_max_priority():
  buf = replay.prioritized_init(jnp.zeros(()), capacity=8, alpha=0.5)
  buf = replay.prioritized_add(buf, jnp.arange(3.0))  # default priority 1 -> p^alpha = 1
  np.testing.assert_allclose(buf.priorities()[:3], 1.0)
  buf = replay.prioritized_update(buf, jnp.array([1]), jnp.array([9.0]))  # 9^0.5 = 3
  np.testing.assert_allclose(buf.priorities()[:3], [1.0, 3.0, 1.0], rtol=1e-6)
  buf = replay.prioritized_add(buf, jnp.arange(2.0))  # new items get the max raw priority seen (9) -> 3
  np.testing.assert_allclose(buf.priorities()[:5], [1.0, 3.0, 1.0, 3.0, 3.0], rtol=1e-6)
  np.testing.assert_allclose(buf.total, 11.0, rtol=1e-6)


def test_capacity_error():
  with pytest.raises(ValueError, match="capacity"):
    replay.uniform_init(jnp.zeros(()), 0)
