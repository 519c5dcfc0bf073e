"""d2pruning: the small-scale reproduction (`reproduce`) and the benchmark (`benchmark`).

The method lives in the package's method modules and `experiment.run`; this module holds the studies
that the paper's claims are checked with (experiments/reproduce.py and experiments/benchmark.py call them).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from iclr24_jax.common import bench
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import sharding
from iclr24_jax.common import stats
from iclr24_jax.papers.d2pruning import dataset_graph
from iclr24_jax.papers.d2pruning import message_passing as mp
from iclr24_jax.papers.d2pruning import model as model_lib
from iclr24_jax.papers.d2pruning.experiment import METHOD_LABELS, run


def _gamma_note(res: dict, rate: str) -> str:
  chosen = res.get("d2_gamma_reverse_chosen", {}).get(rate)
  default = res.get("d2_sweep", {}).get("d2@0.1", {}).get(rate)
  note = f"D2 gamma_r {chosen:g} (chosen on val)" if chosen is not None else ""
  if default is not None:
    note += f", D2 at the default gamma_r 0.1: {default['test']:.4f}"
  return note


PAPER_CLAIM = "D2 improves over previous state-of-the-art selectors for up to 70% pruning (abstract; CIFAR/ImageNet/NLP)"
ABLATION_CLAIM = "forward message passing helps: D2 > D2 without it (the paper's ablation)"
# The paper sentences the claim rows test.
BASIS = ("'D2 Pruning improves coreset selection over previous state-of-the-art methods for up to 70% pruning rates' "
         "(abstract)")
BASIS_ABLATION = ("'D2 Pruning updates the difficulty scores of each example by incorporating the difficulty of its "
                  "neighboring examples in the dataset graph' (abstract; the forward message passing ablation)")

# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper="d2pruning", experiment="NLP data set (StrategyQA, MiniLM embeddings): D2 vs the other selectors",
        metric="coreset test accuracy",
        basis=("'We evaluate ... on various vision and NLP datasets. Results show D2 Pruning improves coreset "
               "selection over previous state-of-the-art methods' (abstract)"),
        reason="the main job runs the vision data sets only",
        variant="configs/d2pruning.py:text, judged over seeds like the digits rows"),
    stats.not_run_row(
        paper="d2pruning", experiment="filtering a large multimodal data set", metric="diversity; zero-shot accuracy",
        basis=("'using D2 Pruning for filtering large multimodal datasets leads to increased diversity in the dataset "
               "and improved generalization of pretrained models' (abstract)"),
        reason="no image-text pool or pretraining arm here (the paper filters DataComp and pretrains CLIP)",
        variant="an arm that filters an image-text pool with D2 (self-supervised scores) and pretrains a CLIP on it"),
]
CHECKED = ("checked against a reference: D2's picks equal the official dense algorithm's (test_d2_matches_official_"
           "dense_algorithm) and gamma_r is tuned on validation; likely cause: near-separable data where coverage "
           "(k-center) or easy-example removal wins at 70% (README)")


def _claim_rows(name: str, res: dict, fast: bool) -> list[dict]:
  """One paired row per (pruning rate, other selector): D2 vs that selector, judged over seeds."""
  rows = []
  acc = res["accuracy"]
  others = [m for m in acc if m != "d2"]
  for rate in sorted(acc.get("d2", {}), key=float):
    d2 = acc["d2"][rate]["per_seed"]
    beyond = float(rate) > 0.7
    for m in others:
      claim = ABLATION_CLAIM if m == "d2_nofwd" else PAPER_CLAIM + (
          "; 90% lies beyond the abstract's range (judged as the same claim)" if beyond else "")
      note = (f"{METHOD_LABELS.get(m, m)}; full data {res['full_data_accuracy']['mean']:.4f}; "
              f"{_gamma_note(res, rate)}; a seed's runs share the training key")
      if m == "d2_nofwd":
        g = acc[m][rate].get("gamma_reverse")
        note += f"; no-forward gamma_r chosen on val{f' {g:g}' if g is not None else ''}"
      rows.append(stats.compare_row(
          paper="d2pruning", experiment=f"{name}, prune {100 * float(rate):.0f}%: D2 vs {METHOD_LABELS.get(m, m)}",
          metric="coreset test accuracy", a=d2, b=acc[m][rate]["per_seed"], name_a="D2", name_b=m,
          paper_value=claim, direction="greater", paired=True, notes=note, kind="claim",
          basis=BASIS_ABLATION if m == "d2_nofwd" else BASIS))
      if fast:
        rows[-1]["holds"] = None
      elif rows[-1]["holds"] == "no":
        rows[-1]["notes"] += "; " + CHECKED
  return rows


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Digits (3 seeds, 30/50/70% pruning) and MNIST-5k (5 seeds, 70/90%: D2, D2 without the forward pass, CCS,
  k-center, random); one paired row per (rate, selector)."""
  rows = []
  variants = [("tiny", "digits (tiny)")] if fast else [("", "digits"), ("mnist5k", "MNIST-5k")]
  plots = []
  for variant, name in variants:
    cfg = get_config(variant)
    sub = os.path.join(workdir, variant or "digits")
    t0 = time.perf_counter()
    res = run(cfg, sub)
    claim = _claim_rows(name, res, fast)
    plots += res.get("plots", [])
    for r in claim:
      r["notes"] += f"; {name} run {time.perf_counter() - t0:.0f}s"
    rows.extend(claim)
  if rows:
    rows[0]["plots"] = plots
  return rows


def official_graph_density_select(x: np.ndarray, scores: np.ndarray, budget: int, k: int = 10,
                                  gamma: float = 0.1) -> list[int]:
  """The official `GraphDensitySampler` (core/data/sampling.py; graph_mode 'sum', graph_sampling_mode
  'weighted'), re-implemented step by step in numpy / scikit-learn for timing beside ours: its code is not an
  importable package. Kept as it runs: dense N x N distances (`pairwise_distances`), a dense kNN connectivity
  matrix (`kneighbors_graph(...).todense()`), a Python loop over the kNN entries writing both directions'
  weights exp(-d) max(s, 1e-7), a Python loop for the densities, and a selection loop that reads a dense row
  for the neighbours and resets the picked rows to min - 1 after every pick.

  Args:
    x: [N, D] embeddings.
    scores: [N] difficulty scores.
    budget: picks.
    k: neighbours (`--n-neighbor`).
    gamma: the reverse kernel's rate (`--gamma`).

  Returns:
    the picked indices (the official returns `list(set)`: order not kept).
  """
  from sklearn.metrics import pairwise_distances
  from sklearn.neighbors import kneighbors_graph
  distances = pairwise_distances(x, x)
  connect = kneighbors_graph(x, k, p=2).todense()
  for i, j in zip(*connect.nonzero()):
    connect[i, j] = np.exp(-distances[i, j]) * max(scores[j].item(), 1e-7)
    connect[j, i] = np.exp(-distances[i, j]) * max(scores[i].item(), 1e-7)
  density = np.zeros(x.shape[0])
  for i in range(x.shape[0]):
    density[i] = connect[i, :].sum() + scores[i].item()
  batch = set()
  while len(batch) < budget:
    u = np.argmax(density)
    nbrs = (connect[u, :] > 0).nonzero()[1]
    density[nbrs] = density[nbrs] - np.exp(-distances[u, nbrs] * gamma) * density[u]
    batch.add(u)
    density[list(batch)] = min(density) - 1
  return list(batch)


_FIRST_CALL = """
import os, sys, time
sys.path.insert(0, os.getcwd())
if os.environ.get("ICLR24_JAX_COMPILATION_CACHE") != "0":
  from iclr24_jax.common.compile_cache import enable_compilation_cache
  enable_compilation_cache()
import numpy as np
from iclr24_jax.papers.d2pruning import selection
rng = np.random.default_rng(0)
x = rng.normal(size=({n}, 64)).astype(np.float32)
s = rng.random({n}).astype(np.float32)
t0, c0 = time.perf_counter(), time.process_time()
selection.select_coreset(x, s, {fraction}, method="d2", k=10, gamma_reverse=0.1)
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def _first_call_s(n: int, fraction: float, cached: bool) -> tuple[float | None, float | None]:
  """A user's first `select_coreset` call in a fresh process: compilation cache off, or on (a first process fills
  the cache, the second is timed: its executables load from disk whole, `compile_cache.cached_call`). Returns
  (wall s, CPU s) ((None, None) if the child failed)."""
  import subprocess
  import sys
  env = dict(os.environ, ICLR24_JAX_COMPILATION_CACHE="1" if cached else "0")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  try:
    for _ in range(2 if cached else 1):
      out = subprocess.run([sys.executable, "-c", _FIRST_CALL.format(n=n, fraction=fraction)], env=env, cwd=root,
                           capture_output=True, text=True, timeout=900, check=True)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)
  except Exception:  # noqa: BLE001  (reported as missing, never guessed)
    return None, None


def selection_vs_official(n: int, fraction: float = 0.3, repeats: int = 3) -> dict:
  """`select_coreset(method='d2')` end to end against the official sampler on the same inputs, side by side.

  64-D Gaussian embeddings, uniform scores, k = 10, gamma_r = 0.1, `fraction` kept, no classes. Ours: first
  call in a fresh process (compilation cache off, then on), then the median of `repeats` calls; the official:
  one timed call (`repeats` below N = 10,000).

  Args:
    n: examples N.
    fraction: kept fraction (budget = fraction N).
    repeats: our timed calls.

  Returns:
    a row (name, size, first_call_s, first_call_cpu_s (cache off), first_call_cached_s, first_call_cached_cpu_s,
    first_call_cached_over_median (a cached first call / a warm call; target <= 1.5), median_s, cpu_s, peer,
    peer_median_s, peer_cpu_s, ratio, cpu_ratio (process CPU seconds: less sensitive to a shared machine's load),
    same_selection, load).
  """
  import statistics
  from iclr24_jax.papers.d2pruning import selection
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, 64)).astype(np.float32)
  s = rng.random(n).astype(np.float32)
  ours = lambda: selection.select_coreset(x, s, fraction, method="d2", k=10, gamma_reverse=0.1)
  picks = ours()
  first_cold, first_cpu = _first_call_s(n, fraction, cached=False)
  first_cached, first_cached_cpu = _first_call_s(n, fraction, cached=True)
  t_ours, t_peer, c_ours, c_peer = [], [], [], []
  for r in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    ours()
    t_ours.append(time.perf_counter() - t0)
    c_ours.append(time.process_time() - c0)
    if r == 0 or n < 10_000:
      t0, c0 = time.perf_counter(), time.process_time()
      official = official_graph_density_select(x, s, len(picks), k=10, gamma=0.1)
      t_peer.append(time.perf_counter() - t0)
      c_peer.append(time.process_time() - c0)
  med, peer = statistics.median(t_ours), statistics.median(t_peer)
  return {"name": "d2pruning/select_coreset_vs_official", "size": n, "batch": len(picks), "mesh_devices": 1,
          "first_call_s": first_cold, "first_call_cpu_s": first_cpu, "first_call_cached_s": first_cached,
          "first_call_cached_cpu_s": first_cached_cpu,
          "first_call_cached_over_median": None if first_cached is None else first_cached / med,
          "median_s": med, "cpu_s": statistics.median(c_ours),
          "peer": "official GraphDensitySampler (numpy re-implementation)", "peer_median_s": peer,
          "peer_cpu_s": statistics.median(c_peer), "ratio": peer / med,
          "cpu_ratio": statistics.median(c_peer) / statistics.median(c_ours),
          "target": ">= 2" if n <= 2_000 else ">= 15" if n >= 20_000 else "-",
          "same_selection": bool(set(official) == set(picks.tolist())), "load": os.getloadavg()[0],
          "repeats": repeats, "peer_repeats": len(t_peer),
          "notes": "64-D Gaussian, uniform scores, k 10, gamma_r 0.1, 30% kept, no classes; first calls in a fresh "
                   "process (cache off / on)"}


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """`select_coreset` against the official sampler side by side (N = 2,000 and 20,000; more with quick=False);
  graph build / forward MP / reverse-MP selection vs N and k; batched coreset training on 1 and all devices."""
  rows = [selection_vs_official(n) for n in ((2_000, 20_000) if quick else (2_000, 5_000, 10_000, 20_000))]
  sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
  rng = np.random.default_rng(0)
  for n in sizes:
    x = rng.normal(size=(n, 64)).astype(np.float32)
    s = jnp.asarray(rng.random(n), jnp.float32)
    if n > 10_000 or (quick and n > 1_000):
      ks = (10,)  # the exact kNN dominates here (~1 min at 1e5 on 2 CPU cores)
    else:
      ks = (5, 10) if quick else (5, 10, 20)
    for k in ks:
      built = []
      rows.append(bench.time_host(lambda: built.append(dataset_graph.knn_graph(x, k)) or built[-1].senders,
                                  repeats=0 if n >= 10_000 else 2, name="d2pruning/knn_graph", items=n, size=n,
                                  k=k, mesh_devices=1))
      graph = built[-1]
      fwd = jax.jit(lambda snd, rcv, e, sc: mp.forward_message_passing(
          graph._replace(senders=snd, receivers=rcv, edges=e), sc, 1.0, "sum"))
      rows.append(bench.time_fn(fwd, graph.senders, graph.receivers, graph.edges, s, repeats=5, items=n,
                                name="d2pruning/forward_mp", size=n, k=k, mesh_devices=1,
                                edges=int(graph.senders.shape[0])))
      k_max = dataset_graph.max_degree(graph)
      lists = mp.neighbour_lists(graph)
      block = mp.auto_block_size(n, lists[0].shape[0] / n)
      # flat argmax costs O(N) per pick: time it on a shorter budget at large N (cost per item is the point)
      variants = [(0, min(n // 2, 2_000))] + ([(block, n // 2)] if block else [])
      for bs, budget in variants:
        sel = jax.jit(lambda a, b, c, d, sc, bs=bs, budget=budget: mp.select_from_lists(a, b, c, d, sc, budget, 0.1,
                                                                                     block_size=bs))
        row = bench.time_fn(sel, *lists, s, repeats=2 if n >= 10_000 else 3, items=budget,
                            name=f"d2pruning/select_{'flat' if bs == 0 else f'blocked{bs}'}", size=n, k=k,
                            batch=budget, mesh_devices=1, k_max=k_max, mean_degree=lists[0].shape[0] / n)
        row["us_per_selected"] = 1e6 * row["median_s"] / budget
        rows.append(row)
  # the batched coreset trainer (the reproduction's cost), runs sharded over 1 and all devices
  cfg = get_config("tiny")
  ds = data_lib.load_digits()
  model, tx = model_lib.create_classifier(cfg, ds.num_classes, cfg.num_steps)
  train_many = model_lib.make_coreset_trainer(model, tx, ds.input_shape, 50, cfg.batch_size)
  num_runs = 16
  idx, sizes_ = model_lib.pad_coresets([np.arange(600)] * num_runs)

  def make_case(mesh, _):
    runs = NamedSharding(mesh, P(sharding.DATA_AXIS))
    rep = sharding.replicated_sharding(mesh)
    shardings = (runs, rep, rep, runs, runs)
    fn = jax.jit(train_many, in_shardings=shardings, out_shardings=runs)
    # Placed explicitly: under `jax.set_mesh` a freshly made array is committed replicated, which a sharded
    # in_sharding rejects.
    args = tuple(jax.device_put(a, sh) for a, sh in zip(
        (jax.random.split(jax.random.key(0), num_runs), np.asarray(ds.train.x), np.asarray(ds.train.y),
         np.asarray(idx), np.asarray(sizes_)), shardings))
    return fn, args, dict(items=num_runs * 50, name="d2pruning/coreset_train_50steps", size=num_runs,
                          batch=cfg.batch_size)

  rows += bench.across_devices(make_case, repeats=3)
  return rows


# ------------------------------------------------------------------------------------------------- paper scale


def class_d2_select(embeddings: jax.Array, scores: jax.Array, valid: jax.Array, quotas: jax.Array, *, k: int,
                    gamma_forward: float = 1.0, gamma_reverse: float = 0.1, graph_mode: str = "sum",
                    out_size: int | None = None) -> jax.Array:
  """Class-balanced D2 selection as one program: every class's kNN graph, forward and reverse message passing.

  The library's `selection.d2_select` builds one graph whose edges never cross a group and runs one selection
  loop with per-group quotas; a class's picks depend only on its own examples, so here the classes are laid out
  [C, M, D] (each padded to M) and the same steps are `vmap`ped over C: the exact blocked kNN inside the class
  (`common.graph.knn`), the symmetric union of the kNN lists (each undirected pair once per direction, as
  `dataset_graph.knn_graph`), `message_passing.forward_message_passing` and `select_from_lists`.

  Args:
    embeddings: [C, M, D] the examples of each class (padded rows anywhere, marked by `valid`).
    scores: [C, M] difficulty (higher = harder).
    valid: [C, M] bool, real examples that may be picked (padding and the hard cutoff excluded).
    quotas: [C] int32 picks per class.
    k: neighbours per example.
    gamma_forward, gamma_reverse, graph_mode: see `forward_message_passing` / `select_from_lists`.
    out_size: static picks per class returned (default M).

  Returns:
    [C, out_size] int32 indices into each class's M rows, in selection order, -1 after the class's quota.
  """
  from iclr24_jax.common import graph as graph_lib
  c, m, d = embeddings.shape
  out_size = m if out_size is None else out_size

  def one(x, s, ok, quota):
    groups = jnp.where(ok, 0, -1)
    # [M, k]; inf where absent. One block per class (up to 2,048 rows): the program results/SCALE.md measured.
    dist, idx = graph_lib.knn(x, k, block_size=min(m, 2048), groups=groups)
    live = jnp.isfinite(dist).reshape(-1)
    rows = jnp.repeat(jnp.arange(m, dtype=jnp.int32), k)
    cols = idx.reshape(-1).astype(jnp.int32)
    dd = dist.reshape(-1)
    receivers = jnp.concatenate([rows, cols])                                 # i <- j and j <- i
    senders = jnp.concatenate([cols, rows])
    dists = jnp.concatenate([dd, dd])
    live = jnp.concatenate([live, live])
    receivers = jnp.where(live, receivers, m)                                 # absent edges sort last
    receivers, senders, dists, live = jax.lax.sort((receivers, senders, dists, live), num_keys=2)
    dup = jnp.concatenate([jnp.zeros((1,), bool), (receivers[1:] == receivers[:-1]) & (senders[1:] == senders[:-1])])
    keep = live & ~dup
    # A dropped edge keeps its slot in its receiver's list with sender m (ignored) and distance inf (message 0).
    graph = graph_lib.GraphsTuple(nodes=None, edges=jnp.where(keep, dists, jnp.inf),
                                  senders=jnp.where(keep, senders, m), receivers=receivers,
                                  n_node=np.asarray([m]), n_edge=np.asarray([receivers.shape[0]]), globals=None)
    rho = mp.forward_message_passing(graph, s, gamma_forward, graph_mode)
    nbr, nd, starts, degrees = mp.neighbour_lists(graph)
    return mp.select_from_lists(nbr, nd, starts, degrees, jnp.where(ok, rho, 0.0), quota, gamma_reverse,
                                eligible=ok, out_size=out_size)

  return jax.vmap(one)(embeddings, scores, valid, quotas)


def _same_taps(size: int, kernel: int, stride: int) -> int:
  """Kernel taps that land on the input (not on SAME zero padding), summed over a dimension's outputs."""
  out = -(-size // stride)
  pad = max((out - 1) * stride + kernel - size, 0)
  lo = pad // 2
  return sum(sum(1 for t in range(kernel) if 0 <= o * stride - lo + t < size) for o in range(out))


def resnet_flops(stage_sizes: tuple[int, ...], width: int, image_size: int, num_classes: int,
                 in_channels: int = 3) -> float:
  """Convolution + dense FLOPs of one forward pass of `vision.models.ResNet` (3x3 stem, no max-pool) on one image.

  Per convolution 2 x C_in x C_out x (the kernel taps that fall on the input, summed over the outputs: SAME
  padding's zeros are not multiplied, which at the 4x4 maps of the last stage is 30% of a naive
  H_out W_out k^2 count): the stem, two 3x3 convolutions per basic block (the first of a stage with stride 2 after
  stage 0) and a 1x1 projection where the shape changes; the head 2 x C x classes.

  Args:
    stage_sizes: blocks per stage ((2, 2, 2, 2): ResNet-18).
    width: channels of stage 0.
    image_size: input side.
    num_classes: head width.
    in_channels: input channels.

  Returns:
    FLOPs (float).
  """
  def conv(size, c_in, c_out, kernel=3, stride=1):
    return 2 * c_in * c_out * _same_taps(size, kernel, stride) ** 2

  hw, c_in = image_size, width
  total = conv(hw, in_channels, width)
  for i, n in enumerate(stage_sizes):
    c_out = width * 2 ** i
    for j in range(n):
      stride = 2 if (i > 0 and j == 0 and hw > 1) else 1
      out = -(-hw // stride)
      total += conv(hw, c_in, c_out, 3, stride) + conv(out, c_out, c_out)
      if stride != 1 or c_in != c_out:
        total += conv(hw, c_in, c_out, 1, stride)
      hw, c_in = out, c_out
  return float(total + 2 * c_in * num_classes)


def scale_program(config, mesh):
  """The paper-size programs for `experiments.scale` (`configs/d2pruning.py:paper`, the official CIFAR-100 sizes).

  `config.scale.program` picks one:
  * 'selection' (default): `class_d2_select` over CIFAR-100's 50,000 512-wide embeddings, 100 classes of 500
    (padded to a multiple of the data axis with empty classes), k = 5, 10% kept after a 40% hard cutoff; the
    classes are split over 'data', each device runs its classes' graphs and selection loops.
  * 'selection_imagenet': the same over ImageNet-1k, 1,000 classes padded to 1,300 rows (1,281,167 images).
  * 'train': the ResNet-18 (batch norm) step of `vision.classify.make_train_step` on 256 CIFAR images of the
    coreset, SGD with Nesterov momentum; the 11M parameters replicated, the batch split over 'data'.

  Args:
    config: `get_config('paper')` (with `scale.program` set to the program wanted).
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program.

  Raises:
    ValueError: unknown `scale.program`.
  """
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.common.optim import make_optimizer
  from iclr24_jax.vision import classify
  from iclr24_jax.vision.models import create_model
  s = scale_lib.paper_scale(config, "d2pruning")
  rep = NamedSharding(mesh, P())
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)
  common_kw = dict(paper_hardware=s.paper_hardware, paper_time=s.paper_time)
  if s.program in ("selection", "selection_imagenet"):
    imagenet = s.program == "selection_imagenet"
    classes = int(s.imagenet_classes if imagenet else s.num_classes)
    m = int(s.imagenet_class_size if imagenet else s.class_size)
    points = int(s.imagenet_points) if imagenet else classes * m
    d = int(s.embedding_dim)
    data_axis = int(mesh.shape["data"])
    c_pad = -(-classes // data_axis) * data_axis
    sel = config.selection
    keep = 1.0 - float(sel.pruning_rates[0])
    out = -(-int(round(keep * m)) // 8) * 8 + 8        # a class's quota: ~10% of its rows (bin_allocate), padded
    k = int(sel.k)
    spec = lambda *shape_dtype: jax.ShapeDtypeStruct(*shape_dtype, sharding=NamedSharding(mesh, P("data")))
    args = (spec((c_pad, m, d), jnp.float32), spec((c_pad, m), jnp.float32), spec((c_pad, m), jnp.bool_),
            spec((c_pad,), jnp.int32))

    def select(embeddings, scores, valid, quotas):
      return class_d2_select(embeddings, scores, valid, quotas, k=k, gamma_forward=float(sel.gamma_forward),
                             gamma_reverse=float(sel.gamma_reverse), graph_mode=str(sel.graph_mode), out_size=out)

    # The class's distance matrix 2 M^2 D (q.x) + 3 M^2 (|q|^2 - 2 q.x + |x|^2) for every padded class; the
    # message passing and the selection loop are O(M k) and O(quota (M / B + B + deg)) and not counted (XLA
    # counts a while loop's body once).
    hand = c_pad * (2.0 * m * m * d + 3.0 * m * m)
    name = "ImageNet-1k" if imagenet else "CIFAR-100"
    return scale_lib.Program(
        name=f"class-balanced D2 selection ({name}: {points:,} embeddings, {classes} class graphs, k = {k})",
        fn=select, args=args, out_shardings=NamedSharding(mesh, P("data")), params=0, items_per_step=points,
        item="examples", hand_flops=hand, kind="inference",
        notes=(f"Classes padded to {c_pad} x {m} rows and split over 'data'; per class the exact blocked kNN, "
               "the symmetric graph (sorted, duplicates dropped), forward message passing and the reverse "
               f"selection loop (a while loop: its picks, ~{out - 8} per class, are counted once). Deviation: "
               + ("the official ImageNet command groups by 25 score strata (coreset-mode graph), not by class."
                  if imagenet else "the 40% hard cutoff is applied on the host (the `valid` mask).")),
        **common_kw)
  if s.program == "train":
    model = create_model(config.model, int(s.num_classes))
    tx = make_optimizer(config.optimizer, int(config.num_steps))
    hw = int(s.image_size)
    state = jax.eval_shape(lambda: classify.init(jax.random.key(0), model, (hw, hw, 3), tx))
    b = int(config.batch_size)
    batch = {"x": jax.ShapeDtypeStruct((b, hw, hw, 3), jnp.float32), "y": jax.ShapeDtypeStruct((b,), jnp.int32)}
    state_sh = scale_lib.train_state_shardings(state, scale_lib.replicated(state.params, mesh), mesh,
                                               extra=scale_lib.replicated(state.extra, mesh))
    state_abs = scale_lib.abstract(state, state_sh)
    n_params = scale_lib.num_elements(state.params)
    fwd = resnet_flops(tuple(config.model.stage_sizes), int(config.model.width), hw, int(s.num_classes))
    # forward + backward 3x the convolutions, and the SGD update (weight decay, Nesterov momentum: 8 FLOPs per
    # parameter, XLA's count) on every device (the parameters are replicated).
    hand = 3.0 * b * fwd + int(mesh.devices.size) * 8.0 * n_params
    return scale_lib.Program(
        name=f"ResNet-18 coreset train step (CIFAR-100, batch {b}, SGD Nesterov)",
        fn=classify.make_train_step(model), args=(state_abs, scale_lib.abstract(
            batch, scale_lib.batch_shardings(batch, mesh)), key), out_shardings=(state_sh, rep),
        donate_argnums=(0,), carry=True, params=n_params, items_per_step=b, item="images", hand_flops=hand,
        kind="train", abstract_params=state_abs.params,
        notes="Parameters (45 MB in float32) and batch statistics replicated: they fit; the batch split over 'data'.",
        **common_kw)
  raise ValueError(f"d2pruning scale.program={s.program!r}; choose one of {tuple(s.programs)}.")
