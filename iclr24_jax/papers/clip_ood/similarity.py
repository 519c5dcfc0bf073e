"""Nearest-neighbour similarities in an embedding space, similarity-based pruning and similarity splits.

All similarities are cosine similarities of unit-norm embeddings (the paper: CLIP ViT-B/16+ image
embeddings, `ViT-B-16-plus-240__laion400m_e32` in the official scripts), computed as dot products in
blocks of `chunk` keys so the [queries x keys] matrix never exists in full, and optionally sharded over
the keys on a device mesh: every device scans its own shard of the keys, then the per-shard results are
merged (a top-k of the gathered top-k's, or an OR / max of per-key results that stay sharded).

Paper (Sec. 4, Fig. 5) and official code (`src/sims_and_paths/`):
  * s_j = max_{x in ImageNet-train} sim(test_j, x)                    (per_query_imagenet_train.npy)
  * prune pool sample i if sim(test_j, i) > s_j for some test point j of any benchmark (the union,
    `paths_pruned_combined_per_query`), so that no test point is closer to the pruned pool than to ImageNet;
  * the converse splits keep the pool samples with the highest (or lowest) max similarity to a benchmark
    (`paths_pruned_far_*` keeps the most similar, `paths_pruned_near_*` the most dissimilar).
The official scripts find the candidates with a per-test-point top-k (10k-20k per query) and prune those
above s_j, which misses samples when more than k pool points beat s_j for one query; `similarity_prune`
computes the exact union by default and matches the official candidate search behind `num_candidates`.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from iclr24_jax.common import checks

_HIGHEST = lax.Precision.HIGHEST


def check_embeddings(name: str, x, dim: int | None = None, where: str = "clip_ood") -> object:
  """Checks an [N, D] matrix of embeddings (with D == dim when given).

  Shapes raise `checks.ShapeError` at trace time; NaN / inf raise `checks.NonFiniteError` when readable, else
  the condition is returned for `checks.poison` (no host fetch of traced or multi-host arrays).
  """
  if np.ndim(x) != 2:
    raise checks.ShapeError(f"{where}: {name} must be a [N, D] matrix of embeddings, got shape {np.shape(x)}.")
  if dim is not None and np.shape(x)[1] != dim:
    raise checks.ShapeError(f"{where}: {name} has dimension {np.shape(x)[1]} but the other embeddings have {dim}; "
                            "use one embedding model for every set.")
  return checks.finite(where, name, x, "check the embedding model's outputs.")


def _mesh_axes(mesh: Mesh) -> tuple[str, ...]:
  return tuple(mesh.axis_names)


def _pad_rows(x: jax.Array, multiple: int, value=0) -> jax.Array:
  pad = (-x.shape[0]) % multiple
  if not pad:
    return x
  return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), constant_values=value)


def _local_topk(queries: jax.Array, keys: jax.Array, key_mask: jax.Array, k: int, chunk: int,
                offset: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Top-k over keys [n, D] (n divisible by chunk) scanned in blocks; indices are offset + local index."""
  q_n = queries.shape[0]
  n_blocks = keys.shape[0] // chunk
  blocks = keys.reshape(n_blocks, chunk, keys.shape[1])
  masks = key_mask.reshape(n_blocks, chunk)
  starts = jnp.arange(n_blocks, dtype=jnp.int32) * chunk

  def body(carry, inp):
    vals, idx = carry
    kb, mb, start = inp
    sims = jnp.dot(queries, kb.T, precision=_HIGHEST)                     # [Q, chunk]
    sims = jnp.where(mb[None, :], sims, -jnp.inf)
    gidx = jnp.broadcast_to(offset + start + jnp.arange(chunk, dtype=jnp.int32), (q_n, chunk))
    # Earlier keys sit first, and lax.top_k prefers lower positions among ties: ties go to the lower index.
    all_v = jnp.concatenate([vals, sims], axis=1)
    all_i = jnp.concatenate([idx, gidx], axis=1)
    v, pos = lax.top_k(all_v, k)
    return (v, jnp.take_along_axis(all_i, pos, axis=1)), None

  init = (jnp.full((q_n, k), -jnp.inf, queries.dtype), jnp.full((q_n, k), -1, jnp.int32))
  (vals, idx), _ = lax.scan(body, init, (blocks, masks, starts))
  return vals, idx


def topk_similarity(queries: jax.Array, keys: jax.Array, k: int, chunk: int = 1024, mesh: Mesh | None = None,
                    key_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """The k most similar keys of every query (exact, blocked over keys, optionally sharded over keys).

  Pure and jittable (`k`, `chunk`, `mesh` static). With a mesh, the keys are split over all mesh axes: each
  device scans its shard in blocks of `chunk`, the per-device top-k lists are all-gathered and merged by one
  more top-k (the official scripts' accumulate-and-top-k, done across devices).

  Args:
    queries: [Q, D] unit-norm embeddings (e.g. benchmark images).
    keys: [N, D] unit-norm embeddings (e.g. the training pool).
    k: neighbours per query, 1 <= k <= N.
    chunk: keys per block (memory is Q x chunk per device).
    mesh: optional device mesh to shard the keys over.
    key_mask: optional [N] bool; keys with False are ignored (e.g. samples already pruned).

  Returns:
    values [Q, k] float (descending; -inf where fewer than k keys are valid) and indices [Q, k] int32 into
    `keys` (-1 where the value is -inf). Ties go to the lower key index, as a stable sort would.

  Raises:
    ContractError: on shape mismatches, k out of range, chunk < 1, or NaN/inf in readable inputs; under jit
      NaN/inf inputs give NaN values and -1 indices instead.
  """
  where = "clip_ood.topk_similarity"
  ok = checks.all_ok(check_embeddings("queries", queries, where=where),
                     check_embeddings("keys", keys, np.shape(queries)[1], where=where))
  n = keys.shape[0]
  k = checks.static_int(where, "k", k, low=1, high=n)
  chunk = checks.static_int(where, "chunk", chunk, low=1)
  chunk = min(chunk, n)
  if key_mask is None:
    key_mask = jnp.ones((n,), bool)
  else:
    checks.shapes(where, key_mask=(key_mask, f"{n}"))
  queries = jnp.asarray(queries)
  keys = jnp.asarray(keys, queries.dtype)
  key_mask = jnp.asarray(key_mask, bool)

  if mesh is None or mesh.size == 1:
    keys_p = _pad_rows(keys, chunk)
    mask_p = _pad_rows(key_mask, chunk, False)
    vals, idx = _local_topk(queries, keys_p, mask_p, min(k, keys_p.shape[0]), chunk, jnp.int32(0))
  else:
    axes = _mesh_axes(mesh)
    n_dev = mesh.size
    local_n = -(-n // n_dev)
    local_chunk = min(chunk, local_n)
    local_n = -(-local_n // local_chunk) * local_chunk
    keys_p = _pad_rows(keys, local_n * n_dev)
    mask_p = _pad_rows(key_mask, local_n * n_dev, False)
    k_local = min(k, local_n)

    def shard_fn(q, kl, ml):
      offset = lax.axis_index(axes).astype(jnp.int32) * local_n
      v, i = _local_topk(q, kl, ml, k_local, local_chunk, offset)
      v_all = lax.all_gather(v, axes, axis=1, tiled=True)              # [Q, n_dev * k_local], device order
      i_all = lax.all_gather(i, axes, axis=1, tiled=True)
      v, pos = lax.top_k(v_all, k)
      return v, jnp.take_along_axis(i_all, pos, axis=1)

    vals, idx = jax.shard_map(shard_fn, mesh=mesh, in_specs=(P(), P(axes), P(axes)), out_specs=(P(), P()),
                              check_vma=False)(queries, keys_p, mask_p)
  return checks.poison((vals, jnp.where(jnp.isfinite(vals), idx, -1)), ok, int_fill=-1)


def nearest_similarity(queries: jax.Array, keys: jax.Array, chunk: int = 1024, mesh: Mesh | None = None,
                       key_mask: jax.Array | None = None) -> jax.Array:
  """Similarity of every query to its nearest key: [Q] (-inf if no key is valid). Pure, jittable."""
  return topk_similarity(queries, keys, 1, chunk, mesh, key_mask)[0][:, 0]


def _local_max_margin(queries: jax.Array, offsets: jax.Array, keys: jax.Array, chunk: int) -> jax.Array:
  n_blocks = keys.shape[0] // chunk
  blocks = keys.reshape(n_blocks, chunk, keys.shape[1])

  def body(_, kb):
    sims = jnp.dot(queries, kb.T, precision=_HIGHEST)                      # [Q, chunk]
    # official: brendel-group/clip-ood@0f7b418 src/sims_and_paths/compute_max_sims.py:84-85 (max over the test set)
    return None, jnp.max(sims - offsets[:, None], axis=0)

  _, out = lax.scan(body, None, blocks)
  return out.reshape(-1)


def max_margin(queries: jax.Array, keys: jax.Array, offsets: jax.Array | None = None, chunk: int = 1024,
               mesh: Mesh | None = None) -> jax.Array:
  """For every key i: max_j (sim(query_j, key_i) - offsets_j), blocked over keys, sharded over keys.

  With offsets = s_j this is > 0 exactly when some query is closer to key i than its threshold (the
  pruning rule); with offsets = 0 it is the key's maximum similarity to the query set.

  Args:
    queries: [Q, D] unit-norm embeddings.
    keys: [N, D] unit-norm embeddings.
    offsets: [Q] per-query thresholds (default 0).
    chunk: keys per block (memory Q x chunk per device).
    mesh: optional mesh; keys are split over all its axes and the result stays split the same way.

  Returns:
    [N] float (NaN under jit for NaN / inf embeddings; eager calls raise).
  """
  where = "clip_ood.max_margin"
  ok = checks.all_ok(check_embeddings("queries", queries, where=where),
                     check_embeddings("keys", keys, np.shape(queries)[1], where=where))
  checks.shapes(where, queries=(queries, "Q D"), offsets=(offsets, "Q"))
  n = keys.shape[0]
  queries = jnp.asarray(queries)
  keys = jnp.asarray(keys, queries.dtype)
  offsets = jnp.zeros((queries.shape[0],), queries.dtype) if offsets is None else jnp.asarray(offsets, queries.dtype)
  chunk = min(checks.static_int(where, "chunk", chunk, low=1), n)
  if mesh is None or mesh.size == 1:
    return checks.poison(_local_max_margin(queries, offsets, _pad_rows(keys, chunk), chunk)[:n], ok)
  axes = _mesh_axes(mesh)
  local_n = -(-n // mesh.size)
  local_chunk = min(chunk, local_n)
  local_n = -(-local_n // local_chunk) * local_chunk
  keys_p = _pad_rows(keys, local_n * mesh.size)
  out = jax.shard_map(lambda q, o, kl: _local_max_margin(q, o, kl, local_chunk), mesh=mesh,
                      in_specs=(P(), P(), P(axes)), out_specs=P(axes), check_vma=False)(queries, offsets, keys_p)
  return checks.poison(out[:n], ok)


def _concat_tests(test_emb_list: Sequence[jax.Array], dim: int) -> jax.Array:
  if isinstance(test_emb_list, (np.ndarray, jax.Array)):
    raise checks.DtypeError("clip_ood: test_emb_list must be a list of [M_b, D] arrays (one per benchmark), not "
                            "one array; wrap a single benchmark in a list.")
  tests = list(test_emb_list)
  if not tests:
    raise checks.EmptyInputError("clip_ood: test_emb_list is empty; pass the embeddings of at least one benchmark.")
  for b, t in enumerate(tests):
    check_embeddings(f"test_emb_list[{b}]", t, dim)
  return jnp.concatenate([jnp.asarray(t) for t in tests], axis=0)


def similarity_thresholds(reference_train_emb: jax.Array, test_emb: jax.Array, chunk: int = 1024,
                          mesh: Mesh | None = None) -> jax.Array:
  """s_j = max similarity of test point j to the reference training set (ImageNet-train): [M]."""
  return nearest_similarity(test_emb, reference_train_emb, chunk, mesh)


def similarity_prune(pool_emb: jax.Array, reference_train_emb: jax.Array, test_emb_list: Sequence[jax.Array],
                     chunk: int = 1024, mesh: Mesh | None = None, num_candidates: int | None = None) -> jax.Array:
  """Keep mask of the pool after similarity-based pruning against the union of the benchmarks.

  For each test point j of every benchmark, s_j = max_x sim(j, x) over the reference training set; every
  pool sample i with sim(j, i) > s_j for some j is removed. Afterwards each test point's nearest neighbour
  in the kept pool is at most as similar as its nearest neighbour in the reference set (the paper's
  "similarity gap" of ImageNet, replicated), and a sample below every threshold is never removed.

  Pure and jittable (`chunk`, `mesh`, `num_candidates` static).

  Args:
    pool_emb: [N, D] unit-norm embeddings of the training pool (LAION).
    reference_train_emb: [R, D] embeddings of the reference training set (ImageNet-train).
    test_emb_list: list of [M_b, D] embeddings, one per benchmark; the union is used.
    chunk: keys per block.
    mesh: optional mesh to shard the pool (and the reference set) over.
    num_candidates: None (exact, default) or the official scripts' per-test-point candidate count: only the
      num_candidates most similar pool samples of each test point can be pruned (equal to the exact rule
      when no test point has more than num_candidates pool samples above its threshold).

  Returns:
    keep [N] bool (True = kept). NaN / inf embeddings raise eagerly; under jit the mask keeps nothing (the
    documented sentinel: no pool sample is certified dissimilar).
  """
  where = "clip_ood.similarity_prune"
  ok = check_embeddings("pool_emb", pool_emb, where=where)
  return checks.poison(_similarity_prune(pool_emb, reference_train_emb, test_emb_list, chunk, mesh, num_candidates),
                       ok, bool_fill=False)


def _similarity_prune(pool_emb, reference_train_emb, test_emb_list, chunk, mesh, num_candidates):
  dim = pool_emb.shape[1]
  check_embeddings("reference_train_emb", reference_train_emb, dim)
  tests = _concat_tests(test_emb_list, dim)
  s = similarity_thresholds(reference_train_emb, tests, chunk, mesh)         # [M] s_j
  n = pool_emb.shape[0]
  if num_candidates is None:
    margin = max_margin(tests, pool_emb, s, chunk, mesh)
    return (margin <= 0.0) & ~jnp.isnan(margin)                              # remove iff some sim(j, i) > s_j
  vals, idx = topk_similarity(tests, pool_emb, min(int(num_candidates), n), chunk, mesh)
  hit = (vals > s[:, None]) & (idx >= 0)
  removed = jnp.zeros((n,), bool).at[jnp.where(hit, idx, n)].set(True, mode="drop")
  return ~removed


def max_similarity_to_sets(pool_emb: jax.Array, test_emb_list: Sequence[jax.Array], chunk: int = 1024,
                           mesh: Mesh | None = None) -> jax.Array:
  """Each pool sample's highest similarity to any test point of the given benchmarks: [N]."""
  check_embeddings("pool_emb", pool_emb)
  return max_margin(_concat_tests(test_emb_list, pool_emb.shape[1]), pool_emb, None, chunk, mesh)


def similarity_split(pool_emb: jax.Array, test_emb_list: Sequence[jax.Array], size: int,
                     keep: str = "most_similar", chunk: int = 1024, mesh: Mesh | None = None) -> jax.Array:
  """Keep mask of the `size` pool samples most (or least) similar to the benchmarks.

  The paper's 100M split keeps the half of LAION-200M that is most similar to the benchmarks (it prunes the
  dissimilar points); 'least_similar' is the converse split. Ties go to the lower index.

  Args:
    pool_emb: [N, D] unit-norm pool embeddings.
    test_emb_list: list of [M_b, D] benchmark embeddings (the union is used).
    size: samples to keep (static), 0 <= size <= N.
    keep: 'most_similar' or 'least_similar'.
    chunk, mesh: as in `max_margin`.

  Returns:
    keep [N] bool with exactly `size` True entries (all False under jit for NaN / inf embeddings, which raise
    eagerly).
  """
  where = "clip_ood.similarity_split"
  checks.shapes(where, pool_emb=(pool_emb, "N D"))
  n = pool_emb.shape[0]
  size = checks.static_int(where, "size", size, low=0, high=n)
  checks.choice(where, "keep", keep, ("most_similar", "least_similar"))
  score = max_similarity_to_sets(pool_emb, test_emb_list, chunk, mesh)
  order = jnp.argsort(-score if keep == "most_similar" else score, stable=True)
  return checks.poison(jnp.zeros((n,), bool).at[order[:size]].set(True), ~jnp.any(jnp.isnan(score)),
                       bool_fill=False)
