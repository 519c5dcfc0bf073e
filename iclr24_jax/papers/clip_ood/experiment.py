"""clip_ood experiments: deduplicate a pool, prune it by similarity to the benchmarks, retrain CLIP, compare.

run(config, workdir)      the whole pipeline on the digits analogue (see data.py):
                          1. build the pool ("LAION"), reference set ("ImageNet-train") and benchmarks;
                          2. deduplicate the pool (k-means + within-cluster removal)             -> "full" pool;
                          3. train CLIP on the full pool; its image embeddings are the fixed reference space;
                          4. similarity-prune the full pool against the union of the benchmarks  -> "pruned";
                             a random subset of the same size                                    -> "random";
                             the half most (least) similar to the benchmarks                     -> "most_similar"
                                                                                                 ("least_similar");
                          5. train one CLIP per split (same steps, same init), zero-shot on every benchmark;
                          writes results.json, metrics.jsonl (all trainings, keys prefixed by the split),
                          one checkpoint folder per split, and plots.
The reproduction study and the benchmark are in `study.py`.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.papers.clip_ood import data as data_mod
from iclr24_jax.papers.clip_ood import dedup as dedup_lib
from iclr24_jax.papers.clip_ood import model as model_lib
from iclr24_jax.papers.clip_ood import similarity as sim_lib
from iclr24_jax.vision import clip

CONDITIONS = ("full", "pruned", "random", "most_similar", "least_similar")
CONDITION_LABELS = {"full": "full pool (dedup.)", "pruned": "similarity-pruned", "random": "random, same size",
                    "most_similar": "most-similar split", "least_similar": "least-similar split"}


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_benchmark(config: Any) -> data_mod.Benchmark:
  """The configured data: 'digits_pool' (the embedded analogue) or 'npz' (a user's own pool, see README)."""
  d = config.data
  if d.name == "digits_pool":
    return data_mod.build_benchmark(
        pool_size=int(d.pool_size), reference_size=int(d.reference_size), test_size=int(d.test_size),
        lowres_test_size=int(d.lowres_test_size), duplicate_fraction=float(d.duplicate_fraction),
        contamination=float(d.contamination), class_free_prob=float(d.class_free_prob),
        wrong_label_prob=float(d.wrong_label_prob), seed=int(d.get("seed", config.seed)),
        style_rates=dict(d.style_rates) if d.get("style_rates") else None,
        reference_style_rates=dict(d.reference_style_rates) if d.get("reference_style_rates") else None)
  if d.name == "npz":
    if not d.get("data_dir"):
      raise ValueError("data.name='npz' needs data.data_dir pointing at the .npz file (see README.md).")
    return load_npz(d.data_dir)
  raise ValueError(f"unknown data.name '{d.name}'; choose 'digits_pool' or 'npz'.")


def load_npz(path: str) -> data_mod.Benchmark:
  """A user pool as .npz: pool_images [N,H,W,C], pool_captions [N] str, reference_images, reference_labels,
  class_names [C] str, benchmark_names [B] str and per benchmark `test_<name>_images` / `test_<name>_labels`;
  optional templates [T] str with one '{}' each."""
  p = data_lib.resolve_data_dir(path, "data_dir")
  z = np.load(p, allow_pickle=False)
  need = {"pool_images", "pool_captions", "reference_images", "reference_labels", "class_names", "benchmark_names"}
  missing = need - set(z.files)
  if missing:
    raise ValueError(f"{p} lacks arrays {sorted(missing)}; see clip_ood/README.md for the expected layout.")
  names = [str(n) for n in z["benchmark_names"]]
  tests = {}
  for n in names:
    if f"test_{n}_images" not in z.files or f"test_{n}_labels" not in z.files:
      raise ValueError(f"{p} lists benchmark '{n}' but lacks test_{n}_images / test_{n}_labels.")
    tests[n] = (z[f"test_{n}_images"].astype(np.float32), z[f"test_{n}_labels"].astype(np.int32))
  m = len(z["pool_captions"])
  pool = data_mod.ImageCaptions(z["pool_images"].astype(np.float32), tuple(str(c) for c in z["pool_captions"]),
                                np.full(m, -1, np.int32), np.zeros(m, np.int32), np.zeros(m, np.int32),
                                np.full(m, -1, np.int32))
  templates = tuple(str(t) for t in z["templates"]) if "templates" in z.files else data_mod.ZERO_SHOT_TEMPLATES
  return data_mod.Benchmark(pool, z["reference_images"].astype(np.float32), z["reference_labels"].astype(np.int32),
                            tests, tuple(str(c) for c in z["class_names"]), templates)


def pixel_embeddings(images: np.ndarray) -> np.ndarray:
  """Images [N, H, W, C] -> mean-centred pixel vectors [N, H*W*C] (their cosine is the Pearson correlation),
  the space this analogue deduplicates in (README: the small CLIP's space cannot tell near-duplicates apart)."""
  x = np.asarray(images, np.float32).reshape(len(images), -1)
  return x - x.mean(axis=1, keepdims=True)


def dedup_stats(pool: data_mod.ImageCaptions, keep: np.ndarray) -> dict:
  """How the dedup treated the injected near-duplicate pairs (known from the data generator)."""
  dup = np.flatnonzero(pool.duplicate_of >= 0)
  in_pair = np.zeros(len(pool), bool)
  in_pair[dup] = True
  in_pair[pool.duplicate_of[dup]] = True
  both_kept = keep[dup] & keep[pool.duplicate_of[dup]]
  return {"pool_size": int(len(pool)), "kept": int(keep.sum()), "removed": int((~keep).sum()),
          "injected_pairs": int(len(dup)), "pairs_resolved": int((~both_kept).sum()),
          "pair_recall": float(np.mean(~both_kept)) if len(dup) else None,
          "removed_outside_pairs": int((~keep & ~in_pair).sum()),
          "removed_outside_pairs_by_style": {s: int(np.sum(~keep & ~in_pair & (pool.styles == i)))
                                             for i, s in enumerate(data_mod.STYLES)}}


# ----------------------------------------------------------------------------------------------------------------
# Training and evaluation
# ----------------------------------------------------------------------------------------------------------------


def zero_shot_eval(model: clip.CLIP, params: Any, bench: data_mod.Benchmark, prompts: np.ndarray) -> dict:
  """Zero-shot top-1 accuracy per benchmark (templates averaged per class), plus the mean over OOD sets."""
  num_classes = len(bench.class_names)
  cls = clip.encode_texts(model, params, prompts).reshape(num_classes, len(bench.templates), -1)
  out = {}
  for name, (x, y) in bench.tests.items():
    emb = clip.encode_images(model, params, x)
    out[name] = float(clip.zero_shot_accuracy(jnp.asarray(emb), jnp.asarray(cls), jnp.asarray(y)))
  ood = [v for k, v in out.items() if k != "clean"]
  out["mean_ood"] = float(np.mean(ood)) if ood else None
  out["mean_all"] = float(np.mean([out[k] for k in bench.tests]))
  return out


def train_split(config: Any, name: str, model: clip.CLIP, init_fn, images: np.ndarray, texts: np.ndarray,
                workdir: str | None, mesh, eval_fn=None, progress: bool = True) -> loop_lib.LoopResult:
  """Trains one CLIP on (images [n, H, W, C], texts [n, ...]) with the shared loop (resumable per split)."""
  if len(images) < config.batch_size:
    raise ValueError(f"split '{name}' has {len(images)} samples, fewer than batch_size={config.batch_size}; "
                     "lower batch_size or prune less.")
  stream = data_lib.BatchStream({"image": images, "text": texts}, int(config.batch_size), seed=int(config.seed))
  step = model_lib.train_step_for(model, float(config.model.get("logit_scale_max", clip.LOGIT_SCALE_MAX)))
  eval_every = int(config.get("eval_every", 0))
  return loop_lib.train_loop(
      init_fn=init_fn, train_step=step, batches=stream, num_steps=int(config.num_steps),
      key=jax.random.key(int(config.seed)), workdir=os.path.join(workdir, name) if workdir else None, mesh=mesh,
      log_every=int(config.log_every), eval_every=eval_every, eval_fn=eval_fn if eval_every else None,
      config=config, progress=progress, name=name, **loop_lib.checkpoint_options(config))


@functools.lru_cache(maxsize=8)   # one jitted function per static value: jit caches by function identity
def _similarity_fns(mesh, chunk: int, num_candidates: int | None):
  prune = jax.jit(functools.partial(sim_lib.similarity_prune, chunk=chunk, mesh=mesh, num_candidates=num_candidates))
  split = jax.jit(sim_lib.similarity_split, static_argnames=("size", "keep", "chunk", "mesh"))
  nearest = jax.jit(functools.partial(sim_lib.nearest_similarity, chunk=chunk, mesh=mesh))
  return prune, split, nearest


def make_splits(config: Any, pool_emb: np.ndarray, ref_emb: np.ndarray, test_embs: dict, mesh) -> tuple[dict, dict]:
  """Keep masks of every condition over the (deduplicated) pool, and the similarity diagnostics.

  Returns:
    masks: condition -> [N] bool; info: per benchmark mean s_j and mean nearest-neighbour similarity of
    the test points to each split, the share of test points closer to a split than to the reference set
    (0 for 'pruned' by construction), and the prune/split sizes.
  """
  pc = config.prune
  chunk = int(pc.get("chunk", 1024))
  cand = int(pc.get("num_candidates", 0)) or None
  prune_fn, split_fn, nearest_fn = _similarity_fns(mesh, chunk, cand)
  bench_names = tuple(pc.get("benchmarks", ())) or tuple(test_embs)
  unknown = set(bench_names) - set(test_embs)
  if unknown:
    raise ValueError(f"prune.benchmarks {sorted(unknown)} are not benchmarks here; choose from {sorted(test_embs)}.")
  tests = [jnp.asarray(test_embs[b]) for b in bench_names]
  n = len(pool_emb)
  pool_j, ref_j = jnp.asarray(pool_emb), jnp.asarray(ref_emb)
  t0 = time.perf_counter()
  keep_pruned = np.asarray(prune_fn(pool_j, ref_j, tests))
  prune_s = time.perf_counter() - t0
  size_split = int(round(float(pc.get("split_fraction", 0.5)) * n))
  rng = np.random.default_rng(int(config.seed) + 1)
  keep_random = np.zeros(n, bool)
  keep_random[rng.choice(n, int(keep_pruned.sum()), replace=False)] = True
  masks = {"full": np.ones(n, bool), "pruned": keep_pruned, "random": keep_random,
           "most_similar": np.asarray(split_fn(pool_j, tests, size=size_split, keep="most_similar", chunk=chunk,
                                               mesh=mesh)),
           "least_similar": np.asarray(split_fn(pool_j, tests, size=size_split, keep="least_similar", chunk=chunk,
                                                mesh=mesh))}
  info = {"prune_benchmarks": list(bench_names), "prune_seconds": prune_s,
          "sizes": {k: int(v.sum()) for k, v in masks.items()}, "per_benchmark": {}}
  # nearest-neighbour similarities of all test points at once (one compiled shape), then per benchmark
  names = list(test_embs)
  bounds = np.cumsum([0] + [len(test_embs[b]) for b in names])
  all_tests = jnp.asarray(np.concatenate([test_embs[b] for b in names]))
  s_all = np.asarray(nearest_fn(all_tests, ref_j))
  nn_all = {c: np.asarray(nearest_fn(all_tests, pool_j, key_mask=jnp.asarray(m))) for c, m in masks.items()}
  info["nn_similarity"] = {"reference": s_all, **nn_all}
  for i, b in enumerate(names):
    sl = slice(bounds[i], bounds[i + 1])
    s = s_all[sl]
    row = {"mean_reference_similarity": float(s.mean())}
    for cond in masks:
      nn = nn_all[cond][sl]
      row[f"mean_nn_similarity/{cond}"] = float(nn.mean())
      row[f"share_closer_than_reference/{cond}"] = float(np.mean(nn > s))
      row[f"max_excess/{cond}"] = float(np.max(nn - s))
    info["per_benchmark"][b] = row
  return masks, info


# ----------------------------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------------------------


def _plot_accuracy(results: dict, bench_names: list[str], path: str) -> str:
  conds = [c for c in CONDITIONS if c in results["zero_shot"]]
  fig, axes = metrics_lib.new_figure(size=(7.5, 3.6))
  ax = axes[0, 0]
  width = 0.8 / max(len(conds), 1)
  xs = np.arange(len(bench_names) + 1)
  for i, c in enumerate(conds):
    vals = [results["zero_shot"][c][b] for b in bench_names] + [results["zero_shot"][c]["mean_ood"]]
    ax.bar(xs + (i - (len(conds) - 1) / 2) * width, vals, width, label=f"{CONDITION_LABELS[c]} "
           f"(n={results['splits']['sizes'][c]})")
  ax.set_xticks(xs)
  ax.set_xticklabels([f"{b}\n({data_mod.PAPER_ANALOGUE.get(b, '')})" for b in bench_names] + ["mean OOD"],
                     fontsize=7)
  ax.set_ylabel("zero-shot top-1 accuracy")
  ax.set_ylim(0, 1)
  ax.axhline(1.0 / 10, color="gray", ls=":", lw=1)
  ax.legend(fontsize=7, loc="lower left")
  ax.set_title("CLIP trained on each split of the digits pool")
  return metrics_lib.save_figure(fig, path)


def _plot_similarity(curves: dict, path: str) -> str:
  fig, axes = metrics_lib.new_figure(size=(5.0, 3.6))
  ax = axes[0, 0]
  for label, vals in curves.items():
    v = np.sort(vals)
    ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label, lw=2 if label == "reference set" else 1.2,
            ls="--" if label == "reference set" else "-")
  ax.set_xlabel("nearest-neighbour similarity of a test point to the training set")
  ax.set_ylabel("share of test points (CDF)")
  ax.set_title("similarity gap (all benchmarks)")
  ax.legend(fontsize=7)
  return metrics_lib.save_figure(fig, path)


# ----------------------------------------------------------------------------------------------------------------
# run
# ----------------------------------------------------------------------------------------------------------------


def run(config: Any, workdir: str) -> dict:
  """The whole pipeline (module docstring); returns the results written to results.json."""
  if config.data.name in data_mod.DATASETS:   # the paper's own data: read first (DataNotFoundError
    data_mod.load(config.data)                  # naming the layout and source when absent)
    raise data_lib.paper_data_not_wired("clip_ood", config.data)   # run() does not train on it yet
  os.makedirs(workdir, exist_ok=True)
  timings = {}
  t_all = time.perf_counter()
  key = jax.random.key(int(config.seed))
  key_dedup = jax.random.fold_in(key, 1)
  mesh = sharding.make_mesh(config.get("mesh"))
  progress = bool(config.get("progress", True))

  t0 = time.perf_counter()
  bench = load_benchmark(config)
  timings["data_s"] = time.perf_counter() - t0
  conditions = tuple(config.get("conditions", CONDITIONS))
  unknown = set(conditions) - set(CONDITIONS)
  if unknown or "full" not in conditions:
    raise ValueError(f"config.conditions {conditions} must include 'full' and only use {CONDITIONS}.")

  # 2. deduplicate the raw pool ("LAION-400M -> 200M")
  t0 = time.perf_counter()
  dc = config.dedup
  if dc.space != "pixels":
    raise ValueError(f"dedup.space='{dc.space}' is unknown; 'pixels' is the space of this analogue (README).")
  # Deviation: the paper deduplicates in CLIP embedding space (cosine-distance threshold 0.124); in this small
  # CLIP's space distinct digits of one class and style are as close as near-duplicates, so the analogue
  # deduplicates mean-centred pixel vectors with threshold 0.01 (README).
  keep_dedup = np.ones(len(bench.pool), bool)
  if dc.get("enabled", True):
    keep_dedup = np.asarray(dedup_lib.deduplicate(pixel_embeddings(bench.pool.images), int(dc.num_clusters),
                                                  float(dc.threshold), key_dedup, int(dc.get("num_iters", 50))))
  dstats = dedup_stats(bench.pool, keep_dedup)
  pool = bench.pool.subset(keep_dedup)
  timings["dedup_s"] = time.perf_counter() - t0

  # text inputs and the model (one model object -> one compiled step for every split)
  prompts = data_mod.zero_shot_prompts(bench.class_names, bench.templates)
  texts = model_lib.prepare_texts(config.model.text, pool.captions, prompts)
  model = model_lib.create_model(config.model, texts.vocab_size)
  tx = clip.make_optimizer(config.optimizer, int(config.num_steps))
  image_shape = tuple(pool.images.shape[1:])
  init_fn = functools.partial(clip.init, model=model, image_shape=image_shape, text_shape=texts.shape,
                              text_dtype=texts.dtype, tx=tx)

  def eval_fn(state):
    r = zero_shot_eval(model, state.params, bench, texts.prompts)
    return {f"zero_shot/{k}": v for k, v in r.items() if v is not None}

  results = {"dedup": dstats, "zero_shot": {}, "final_loss": {}, "steps_per_s": {}, "timings": timings,
             "num_steps": int(config.num_steps), "batch_size": int(config.batch_size),
             "text_tower": config.model.text.name, "image_tower": config.model.image.name}
  histories = {}

  # 3. CLIP on the full pool = the fixed reference embedding model
  t0 = time.perf_counter()
  res_full = train_split(config, "full", model, init_fn, pool.images, texts.captions, workdir, mesh, eval_fn, progress)
  timings["train_full_s"] = time.perf_counter() - t0
  states = {"full": res_full.state}
  histories["full"] = res_full.history

  # 4. embeddings in the reference space, splits
  t0 = time.perf_counter()
  params_ref = res_full.state.params
  pool_emb = clip.encode_images(model, params_ref, pool.images)
  ref_emb = clip.encode_images(model, params_ref, bench.reference_images)
  test_embs = {b: clip.encode_images(model, params_ref, x) for b, (x, _) in bench.tests.items()}
  masks, split_info = make_splits(config, pool_emb, ref_emb, test_embs, mesh)
  nn_sims = split_info.pop("nn_similarity")
  results["splits"] = split_info
  results["pruned_by_style"] = {
      s: {"pool": int(np.sum(pool.styles == i)), "kept": int(np.sum(masks["pruned"] & (pool.styles == i)))}
      for i, s in enumerate(data_mod.STYLES) if np.any(pool.styles == i)}
  results["contamination_kept"] = {c: int(np.sum(m & (pool.source == 2))) for c, m in masks.items()}
  timings["splits_s"] = time.perf_counter() - t0

  # 5. one CLIP per split
  for cond in conditions:
    if cond == "full":
      continue
    t0 = time.perf_counter()
    sel = np.flatnonzero(masks[cond])
    r = train_split(config, cond, model, init_fn, pool.images[sel], texts.captions[sel], workdir, mesh, eval_fn,
                    progress)
    timings[f"train_{cond}_s"] = time.perf_counter() - t0
    states[cond] = r.state
    histories[cond] = r.history
  for cond, st in states.items():
    results["zero_shot"][cond] = zero_shot_eval(model, st.params, bench, texts.prompts)
    hist = [h for h in histories[cond] if "train/loss" in h]
    results["final_loss"][cond] = hist[-1]["train/loss"] if hist else None
    sps = [h["steps_per_s"] for h in histories[cond] if "steps_per_s" in h]
    results["steps_per_s"][cond] = sps[-1] if sps else None

  # logs and plots
  with metrics_lib.open_writer(workdir) as writer:
    for cond in states:
      for h in histories[cond]:
        writer.write(h["step"], {f"{cond}/{k}": v for k, v in h.items() if k != "step"})
  plots = []
  if jax.process_index() == 0:
    bench_names = list(bench.tests)
    plots.append(_plot_accuracy(results, bench_names, os.path.join(workdir, "zero_shot_accuracy.png")))
    curves = {"reference set": nn_sims["reference"]}
    curves.update({CONDITION_LABELS[c]: nn_sims[c] for c in ("full", "pruned", "random")})
    plots.append(_plot_similarity(curves, os.path.join(workdir, "similarity_gap.png")))
    removed = np.flatnonzero(~masks["pruned"])
    if len(removed):
      shown = removed[np.random.default_rng(0).choice(len(removed), min(32, len(removed)), replace=False)]
      plots.append(metrics_lib.plot_image_grid(pool.images[shown], os.path.join(workdir, "pruned_examples.png"),
                                               title="pool samples removed by similarity pruning"))
    rows = [h for c in states for h in [{"step": x["step"], f"{c}/loss": x["train/loss"]}
                                         for x in histories[c] if "train/loss" in x]]
    plots.append(metrics_lib.plot_curves(rows, [f"{c}/loss" for c in states], os.path.join(workdir, "curves.png"),
                                         title="CLIP training loss per split"))
  results["plots"] = plots
  timings["total_s"] = time.perf_counter() - t_all
  metrics_lib.write_results(workdir, results)
  return results


# ----------------------------------------------------------------------------------------------------------------
# reproduce / benchmark
# ----------------------------------------------------------------------------------------------------------------
