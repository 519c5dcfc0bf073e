"""Non-IID client partitions: the Dirichlet label-skew split of the official `utils_fl.partition_data('dir')`."""
from __future__ import annotations

import jax
import numpy as np


def _numpy_rng(key: jax.Array) -> np.random.Generator:
  """A numpy generator seeded from a typed JAX key (host-side sampling stays reproducible from the key)."""
  bits = np.asarray(jax.random.bits(key, (4,), dtype=np.uint32))
  return np.random.default_rng(bits.tolist())


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, key: jax.Array) -> list[np.ndarray]:
  """Splits example indices over clients with Dirichlet(alpha) label skew (official 'dir' partition).

  Each client c draws class priors q_c ~ Dir(alpha * 1_K) and a quota of N / C examples (the official
  lognormal quota with sigma = 0). Examples are then dealt one at a time: a random client that still has
  quota draws a class from q_c and takes the next unused example of that class. The official code redraws
  the class while it is exhausted; drawing from q_c renormalised over the classes that still have examples
  is the same distribution and cannot loop forever when q_c puts (numerically) all its mass on exhausted
  classes (then the remaining classes are drawn uniformly).

  Deviation: the official quota is floor(N / C) per client, which leaves N mod C examples unassigned; here
  the first N mod C clients get one more, so the partition covers every index exactly once.

  Args:
    labels: integer labels [N] in [0, K).
    num_clients: C >= 1.
    alpha: Dirichlet concentration > 0 (small = strong label skew; large = close to IID).
    key: a JAX key.

  Returns:
    A list of C int64 index arrays (sorted), disjoint, whose union is arange(N).

  Raises:
    ValueError: on a non-positive alpha, fewer examples than clients, or labels that are not a 1-D integer
      array.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}.")
  if not (alpha > 0 and np.isfinite(alpha)):
    raise ValueError(f"alpha must be a positive finite number (got {alpha}); e.g. 0.1 (skewed) to 100 (IID).")
  n = labels.shape[0]
  if num_clients < 1 or num_clients > n:
    raise ValueError(f"num_clients must be in [1, {n}] for {n} examples (got {num_clients}).")
  if labels.min() < 0:
    raise ValueError("labels must be non-negative class indices.")
  rng = _numpy_rng(key)
  num_classes = int(labels.max()) + 1
  quota = np.full(num_clients, n // num_clients, np.int64)
  quota[: n % num_clients] += 1
  priors = rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)
  pools = [list(rng.permutation(np.flatnonzero(labels == k))) for k in range(num_classes)]
  remaining = np.array([len(p) for p in pools], np.int64)
  out: list[list[int]] = [[] for _ in range(num_clients)]
  open_clients = list(np.flatnonzero(quota > 0))
  while open_clients:
    c = open_clients[rng.integers(len(open_clients))]
    p = priors[c] * (remaining > 0)
    total = p.sum()
    p = p / total if total > 0 else (remaining > 0) / np.sum(remaining > 0)
    k = rng.choice(num_classes, p=p)
    out[c].append(pools[k].pop())
    remaining[k] -= 1
    quota[c] -= 1
    if quota[c] == 0:
      open_clients.remove(c)
  return [np.sort(np.asarray(o, np.int64)) for o in out]


def label_histogram(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
  """Per-client class counts [C, K]."""
  return np.stack([np.bincount(np.asarray(labels)[p], minlength=num_classes) for p in parts])


def mean_label_entropy(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> float:
  """Mean over clients of the entropy (nats) of the client's label distribution (low = strong skew)."""
  h = label_histogram(labels, parts, num_classes).astype(np.float64)
  p = h / np.maximum(h.sum(1, keepdims=True), 1)
  ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0.0), axis=1)
  return float(np.mean(ent))
