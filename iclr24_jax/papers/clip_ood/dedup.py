"""Near-duplicate removal: k-means in the embedding space, then removal inside each cluster.

Official code (`src/deduplication/`): k-means (Euclidean, on normalised CLIP embeddings; 50,000 clusters for
LAION-400M; initial centres are random data points, re-drawn while two centres are more than 0.9 similar;
iterate until fewer than a 1e-7 share of the points change cluster), then inside each cluster, for each
point i, the maximum similarity to the points before it (`torch.tril(sims, -1)`); i is kept iff that
maximum is <= 1 - threshold, threshold = 0.124 (a cosine distance). So the first point of a group of near
duplicates (in data order) is kept, and a point is removed if it is a near duplicate of any earlier point
of its cluster, even one that was itself removed. LAION-400M -> about 200M.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from iclr24_jax.common import checks
from iclr24_jax.papers.clip_ood.similarity import check_embeddings

DEDUP_THRESHOLD = 0.124          # cosine distance below which two images are near duplicates (paper)
_HIGHEST = lax.Precision.HIGHEST


def _normalize(x: jax.Array) -> jax.Array:
  return x * lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-24))


def _assign(x: jax.Array, centers: jax.Array, chunk: int) -> jax.Array:
  """Nearest centre (Euclidean) of every row of x [N, D] (N divisible by chunk) -> [N] int32."""
  c_sq = jnp.sum(centers * centers, axis=1)

  def one(xb):
    d = c_sq[None, :] - 2.0 * jnp.dot(xb, centers.T, precision=_HIGHEST)    # |x|^2 is constant per row
    return jnp.argmin(d, axis=1).astype(jnp.int32)

  return lax.map(one, x.reshape(-1, chunk, x.shape[1])).reshape(-1)


def kmeans(x: jax.Array, num_clusters: int, key: jax.Array, num_iters: int = 50, tol: float = 1e-7,
           chunk: int = 4096) -> tuple[jax.Array, jax.Array]:
  """Lloyd's k-means with Euclidean distance, as the official LAION clustering.

  Pure and jittable (`num_clusters`, `num_iters`, `chunk` static). Initial centres are distinct random data
  points; an empty cluster keeps its previous centre; the loop (`lax.while_loop`) stops when the share of
  points that changed cluster is below `tol` or after `num_iters` iterations.

  Args:
    x: [N, D] points (normalised embeddings).
    num_clusters: K, 1 <= K <= N.
    key: typed PRNG key for the initial centres.
    num_iters: maximum Lloyd iterations.
    tol: stop when fewer than this share of points change cluster (official change_lower_bound 1e-7).
    chunk: rows per assignment block (memory chunk x K).

  Returns:
    centers [K, D] and assignments [N] int32 in [0, K) (NaN centres and -1 assignments under jit for NaN / inf
    points; eager calls raise).
  """
  where = "clip_ood.kmeans"
  ok = check_embeddings("x", x, where=where)
  n = x.shape[0]
  k = checks.static_int(where, "num_clusters", num_clusters, low=1, high=n)
  return checks.poison(_kmeans(x, k, key, num_iters, tol, chunk), ok, int_fill=-1)


def _kmeans(x, k, key, num_iters, tol, chunk):
  n = x.shape[0]
  chunk = int(min(chunk, n))
  x = jnp.asarray(x, jnp.float32)
  pad = (-n) % chunk
  x_p = jnp.pad(x, ((0, pad), (0, 0)))
  centers = x[jax.random.choice(key, n, (k,), replace=False)]

  def step(centers):
    # official: brendel-group/clip-ood@0f7b418 src/deduplication/assign_clusters.py:86-89, 196
    assign = _assign(x_p, centers, chunk)[:n]
    sums = jax.ops.segment_sum(x, assign, num_segments=k)
    counts = jax.ops.segment_sum(jnp.ones((n,), jnp.float32), assign, num_segments=k)
    new = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], centers)
    return new, assign

  def cond(carry):
    it, _, _, changed = carry
    return (it < num_iters) & (changed >= tol)

  def body(carry):
    it, centers, assign, _ = carry
    new_centers, new_assign = step(centers)
    # official: brendel-group/clip-ood@0f7b418 src/deduplication/assign_clusters.py:207-210
    changed = jnp.mean((new_assign != assign).astype(jnp.float32))
    return it + 1, new_centers, new_assign, changed

  init = (jnp.int32(0), centers, jnp.full((n,), -1, jnp.int32), jnp.float32(1.0))
  _, centers, assign, _ = lax.while_loop(cond, body, init)
  # The assignments of the last iteration belong to the centres before its update; re-assign once so the
  # returned pair is consistent (it is the same at convergence).
  return centers, _assign(x_p, centers, chunk)[:n]


def within_cluster_duplicates(embeddings: jax.Array, assignments: jax.Array, threshold: float = DEDUP_THRESHOLD,
                              window: int | None = None, chunk: int = 512) -> jax.Array:
  """Marks point i when an earlier point (lower index) of its cluster is closer than `threshold`.

  The points are sorted by (cluster, index); every point is compared with the `window` points before it in
  that order, which covers its whole cluster when window >= (largest cluster size - 1), so the cost is
  N x (window + chunk) instead of N^2. Pure and jittable (`window`, `chunk` static).

  Args:
    embeddings: [N, D] unit-norm embeddings.
    assignments: [N] int cluster ids (from `kmeans`).
    threshold: cosine distance; i is a duplicate iff max_{j < i, same cluster} sim(i, j) > 1 - threshold.
    window: earlier points compared per point (default N - 1: exact for any clustering).
    chunk: rows per block.

  Returns:
    [N] bool, True = near duplicate of an earlier point of its cluster (to remove); all True under jit for
    NaN / inf embeddings or negative cluster ids (eager calls raise).
  """
  where = "clip_ood.within_cluster_duplicates"
  ok = check_embeddings("embeddings", embeddings, where=where)
  n = embeddings.shape[0]
  checks.shapes(where, known={"N": n}, assignments=(assignments, "N"))
  checks.dtype(where, "assignments", assignments, "integer")
  ok = checks.all_ok(ok, checks.require(where, checks.xp(assignments).asarray(assignments) >= 0,
                                        checks.IndexRangeError, "assignments must be cluster ids >= 0 (kmeans)."))
  return checks.poison(_within_cluster_duplicates(embeddings, assignments, threshold, window, chunk), ok,
                       bool_fill=True)


def _within_cluster_duplicates(embeddings, assignments, threshold, window, chunk):
  n = embeddings.shape[0]
  window = max(int(n - 1 if window is None else window), 1)
  chunk = int(min(chunk, n))
  sim_threshold = 1.0 - float(threshold)
  order = jnp.argsort(assignments, stable=True)                   # by cluster, then by index
  e = jnp.asarray(embeddings, jnp.float32)[order]
  c = jnp.asarray(assignments, jnp.int32)[order]
  tail = (-n) % chunk
  # window rows of padding in front (cluster -1 never matches), tail rows to fill the last block
  e_p = jnp.pad(e, ((window, tail), (0, 0)))
  c_p = jnp.pad(c, (window, tail), constant_values=-1)
  n_blocks = (n + tail) // chunk
  i_idx = jnp.arange(chunk)[:, None]
  j_idx = jnp.arange(window + chunk)[None, :]
  earlier = (j_idx >= i_idx) & (j_idx < i_idx + window)           # key position in [row - window, row)

  def block(b):
    start = b * chunk
    rows = lax.dynamic_slice_in_dim(e_p, start + window, chunk)
    rows_c = lax.dynamic_slice_in_dim(c_p, start + window, chunk)
    keys = lax.dynamic_slice_in_dim(e_p, start, window + chunk)
    keys_c = lax.dynamic_slice_in_dim(c_p, start, window + chunk)
    # official: brendel-group/clip-ood@0f7b418 src/deduplication/utils.py:162-163, 193-194
    sims = jnp.dot(rows, keys.T, precision=_HIGHEST)              # [chunk, window + chunk]
    valid = earlier & (rows_c[:, None] == keys_c[None, :]) & (keys_c[None, :] >= 0)
    # official: brendel-group/clip-ood@0f7b418 src/deduplication/utils.py:202-205 (compute_dedup_paths)
    return jnp.any(valid & (sims > sim_threshold), axis=1)

  dup_sorted = lax.map(block, jnp.arange(n_blocks)).reshape(-1)[:n]
  return jnp.zeros((n,), bool).at[order].set(dup_sorted)


def deduplicate(embeddings: jax.Array, num_clusters: int, threshold: float = DEDUP_THRESHOLD,
                key: jax.Array | None = None, num_iters: int = 50, window: int | None = None,
                chunk: int = 512) -> jax.Array:
  """Keep mask after near-duplicate removal: k-means, then within-cluster removal (first occurrence kept).

  With `window=None` the comparison window is sized on the host from the largest cluster (rounded up to a
  power of two to limit recompilations), so this call is not jittable as a whole; its two pieces
  (`kmeans`, `within_cluster_duplicates`) are. Pass an int `window` (>= largest cluster - 1, e.g. N) to jit it.

  Args:
    embeddings: [N, D] embeddings (normalised here; cosine similarity is used).
    num_clusters: k-means clusters (50,000 for LAION-400M in the paper; ~N / 100 is a fair small-scale choice).
    threshold: cosine-distance threshold (0.124 in the paper).
    key: PRNG key for k-means (default jax.random.key(0)).
    num_iters: maximum k-means iterations.
    window: see above.
    chunk: rows per block.

  Returns:
    keep [N] bool: False for the later members of each near-duplicate group.
  """
  where = "clip_ood.deduplicate"
  check_embeddings("embeddings", embeddings, where=where)
  checks.in_range(where, "threshold", threshold, 0.0, 2.0, hint="a cosine distance (0.124 in the paper).")
  checks.static_int(where, "num_clusters", num_clusters, low=1, high=np.shape(embeddings)[0])
  key = jax.random.key(0) if key is None else key
  x = _normalize(jnp.asarray(embeddings, jnp.float32))
  _, assign = _kmeans_jit(x, int(num_clusters), key, int(num_iters))
  if window is None:
    largest = int(np.bincount(np.asarray(jax.device_get(assign)), minlength=int(num_clusters)).max())
    window = min(1 << max(largest - 1, 1).bit_length(), max(x.shape[0] - 1, 1))
  return ~_within_jit(x, assign, float(threshold), int(window), int(chunk))


_kmeans_jit = jax.jit(kmeans, static_argnums=(1, 3), static_argnames=("tol", "chunk"))
_within_jit = jax.jit(within_cluster_duplicates, static_argnums=(2, 3, 4))
