"""Replay buffers in pure JAX: a uniform ring buffer and a proportional prioritised one (sum-tree).

Both are pytrees of fixed-size arrays (jit/scan-able, shardable); items are any pytree of arrays.

  buf = uniform_init(example_item, capacity)
  buf = uniform_add(buf, items)                       # items: leaves [N, ...]
  batch = uniform_sample(buf, key, batch_size)        # leaves [batch_size, ...]

  pbuf = prioritized_init(example_item, capacity, alpha=0.6)
  pbuf = prioritized_add(pbuf, items)                 # new items get the max priority seen so far
  batch, idx, weights = prioritized_sample(pbuf, key, batch_size, beta=0.4)
  pbuf = prioritized_update(pbuf, idx, new_priorities)   # e.g. |TD error| + eps

Prioritised replay (Schaul et al. 2016): P(i) = p_i^alpha / sum_k p_k^alpha, importance weights
w_i = (N P(i))^-beta / max_j w_j. The sum-tree stores p^alpha at its leaves (an array of 2 * L nodes, L the
capacity rounded up to a power of two, node k's children at 2k and 2k + 1); sampling descends from the root
with stratified uniforms, O(B log L); updates rewrite the log L ancestors of each changed leaf.
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class UniformBuffer:
  """data: leaves [capacity, ...]; insert: next write position; size: filled slots."""

  data: Any
  insert: jax.Array
  size: jax.Array

  @property
  def capacity(self) -> int:
    return jax.tree.leaves(self.data)[0].shape[0]


def _empty_like(example: Any, capacity: int) -> Any:
  return jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example)


def _num_items(items: Any) -> int:
  sizes = {x.shape[0] for x in jax.tree.leaves(items)}
  if len(sizes) != 1:
    raise ValueError(f"replay: items have different leading sizes {sorted(sizes)}; all leaves need [N, ...].")
  return sizes.pop()


def uniform_init(example: Any, capacity: int) -> UniformBuffer:
  """An empty buffer for items shaped like `example` (one item, no leading axis).

  Args:
    example: pytree of arrays (or scalars) with one item's shapes / dtypes, e.g. {'obs': [D], 'reward': []}.
    capacity: number of slots C (>= 1).

  Returns:
    UniformBuffer with zero leaves [C, ...], insert = size = 0 (int32 scalars).

  Raises:
    ValueError: capacity < 1.
  """
  if capacity < 1:
    raise ValueError(f"replay capacity must be >= 1, got {capacity}.")
  return UniformBuffer(_empty_like(example, capacity), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def _write(data: Any, items: Any, start: jax.Array, capacity: int) -> tuple[Any, jax.Array]:
  n = _num_items(items)
  if n > capacity:
    raise ValueError(f"replay: adding {n} items to a buffer of capacity {capacity}; add at most capacity at once.")
  idx = (start + jnp.arange(n)) % capacity
  data = jax.tree.map(lambda d, x: d.at[idx].set(x.astype(d.dtype)), data, items)
  return data, idx


def uniform_add(buf: UniformBuffer, items: Any) -> UniformBuffer:
  """Writes N items (leaves [N, ...]) at the ring position, overwriting the oldest when full.

  Args:
    buf: the buffer (capacity C).
    items: pytree like the buffer's example with leaves [N, ...], N <= C (cast to the buffer's dtypes).

  Returns:
    the updated UniformBuffer (insert advanced by N mod C, size capped at C).

  Raises:
    ValueError: leaves with different N, or N > C.
  """
  cap = buf.capacity
  data, _ = _write(buf.data, items, buf.insert, cap)
  n = _num_items(items)
  return UniformBuffer(data, (buf.insert + n) % cap, jnp.minimum(buf.size + n, cap))


def uniform_sample(buf: UniformBuffer, key: jax.Array, batch_size: int) -> Any:
  """`batch_size` items drawn uniformly with replacement from the filled slots (leaves [batch_size, ...]).

  Sampling an empty buffer returns slot 0 (zeros); check `buf.size` on the host first.

  Args:
    buf: the buffer.
    key: PRNG key.
    batch_size: B, items drawn.

  Returns:
    pytree of the items with leaves [B, ...].
  """
  idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buf.size, 1))
  return jax.tree.map(lambda d: d[idx], buf.data)


@flax.struct.dataclass
class PrioritizedBuffer:
  """data: leaves [capacity, ...]; tree: [2 L] sum-tree of p^alpha (root at 1); max_priority: for new items."""

  data: Any
  tree: jax.Array
  insert: jax.Array
  size: jax.Array
  max_priority: jax.Array
  alpha: float = flax.struct.field(pytree_node=False, default=0.6)

  @property
  def capacity(self) -> int:
    return jax.tree.leaves(self.data)[0].shape[0]

  @property
  def num_leaves(self) -> int:
    return self.tree.shape[0] // 2

  @property
  def total(self) -> jax.Array:
    return self.tree[1]

  def priorities(self) -> jax.Array:
    """[capacity] current p^alpha of each slot (0 for empty slots)."""
    return self.tree[self.num_leaves:self.num_leaves + self.capacity]


def prioritized_init(example: Any, capacity: int, alpha: float = 0.6) -> PrioritizedBuffer:
  """An empty prioritised buffer (alpha = 0 gives uniform sampling).

  Args:
    example: pytree with one item's shapes / dtypes (no leading axis).
    capacity: number of slots C (>= 1); the sum-tree has L = C rounded up to a power of two leaves.
    alpha: priority exponent, P(i) proportional to p_i^alpha (static).

  Returns:
    PrioritizedBuffer with zero leaves [C, ...], tree float32 [2 L] zeros, insert = size = 0,
    max_priority 1.0.

  Raises:
    ValueError: capacity < 1.
  """
  if capacity < 1:
    raise ValueError(f"replay capacity must be >= 1, got {capacity}.")
  leaves = 1 << max(capacity - 1, 0).bit_length()
  return PrioritizedBuffer(_empty_like(example, capacity), jnp.zeros((2 * leaves,), jnp.float32),
                           jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.ones((), jnp.float32), alpha)


def _tree_set(tree: jax.Array, idx: jax.Array, values: jax.Array, num_leaves: int) -> jax.Array:
  """Sets leaves idx [N] to values [N] and recomputes their ancestors (duplicates: the last write wins)."""
  node = idx + num_leaves
  tree = tree.at[node].set(values)
  for _ in range(num_leaves.bit_length() - 1):
    node = node // 2
    tree = tree.at[node].set(tree[2 * node] + tree[2 * node + 1])
  return tree


def prioritized_add(buf: PrioritizedBuffer, items: Any, priorities: jax.Array | None = None) -> PrioritizedBuffer:
  """Writes N items; their priority is `priorities` [N] (raw, before alpha) or the max seen so far.

  Args:
    buf: the buffer (capacity C).
    items: pytree with leaves [N, ...], N <= C.
    priorities: optional [N] raw priorities (> 0); None gives each new item buf.max_priority.

  Returns:
    the updated PrioritizedBuffer (ring insert, size capped at C, max_priority raised to max(priorities)).

  Raises:
    ValueError: leaves with different N, or N > C.
  """
  cap = buf.capacity
  data, idx = _write(buf.data, items, buf.insert, cap)
  n = idx.shape[0]
  p = jnp.full((n,), buf.max_priority) if priorities is None else jnp.asarray(priorities, jnp.float32)
  tree = _tree_set(buf.tree, idx, jnp.power(p, buf.alpha), buf.num_leaves)
  return buf.replace(data=data, tree=tree, insert=(buf.insert + n) % cap, size=jnp.minimum(buf.size + n, cap),
                     max_priority=jnp.maximum(buf.max_priority, jnp.max(p)))


def prioritized_update(buf: PrioritizedBuffer, idx: jax.Array, priorities: jax.Array) -> PrioritizedBuffer:
  """Sets the raw priorities [N] (> 0, e.g. |TD| + 1e-6) of slots idx [N].

  Args:
    buf: the buffer.
    idx: [N] int slot indices (from `prioritized_sample`); for a repeated slot the last write wins.
    priorities: [N] raw priorities (before alpha).

  Returns:
    the updated PrioritizedBuffer (max_priority raised to max(priorities)).
  """
  p = jnp.asarray(priorities, jnp.float32)
  tree = _tree_set(buf.tree, idx, jnp.power(p, buf.alpha), buf.num_leaves)
  return buf.replace(tree=tree, max_priority=jnp.maximum(buf.max_priority, jnp.max(p)))


def sum_tree_find(tree: jax.Array, u: jax.Array, num_leaves: int) -> jax.Array:
  """Leaf index i with cumsum_{<i} <= u < cumsum_{<=i} for each u [B] in [0, total).

  Args:
    tree: [2 L] float sum-tree (root at index 1, leaves at L .. 2L - 1).
    u: [B] float masses in [0, tree[1]).
    num_leaves: L, a power of two (static).

  Returns:
    [B] int32 leaf indices in [0, L).
  """
  node = jnp.ones_like(u, dtype=jnp.int32)
  for _ in range(num_leaves.bit_length() - 1):
    left = tree[2 * node]
    go_right = u >= left
    u = jnp.where(go_right, u - left, u)
    node = 2 * node + go_right.astype(jnp.int32)
  return node - num_leaves


def prioritized_sample(buf: PrioritizedBuffer, key: jax.Array, batch_size: int,
                       beta: float = 0.4) -> tuple[Any, jax.Array, jax.Array]:
  """Proportional sampling with stratified uniforms (one per equal slice of the total mass).

  Args:
    buf: the buffer (sampling an empty buffer returns slot 0).
    key: PRNG key.
    batch_size: B.
    beta: importance-sampling exponent (0: all weights 1; 1: full correction).

  Returns:
    (items with leaves [batch_size, ...], slot indices [batch_size] int32, importance weights [batch_size]).
    The weights are float32 in (0, 1], normalised by their batch maximum.
  """
  total = buf.total
  u = (jnp.arange(batch_size) + jax.random.uniform(key, (batch_size,))) * (total / batch_size)
  u = jnp.minimum(u, total * (1.0 - 1e-6))
  idx = sum_tree_find(buf.tree, u, buf.num_leaves)
  idx = jnp.clip(idx, 0, jnp.maximum(buf.size, 1) - 1)  # float round-off could land on an empty leaf
  probs = buf.tree[idx + buf.num_leaves] / jnp.maximum(total, 1e-12)
  w = jnp.power(jnp.maximum(buf.size, 1).astype(jnp.float32) * jnp.maximum(probs, 1e-12), -beta)
  w = w / jnp.max(w)
  return jax.tree.map(lambda d: d[idx], buf.data), idx, w
