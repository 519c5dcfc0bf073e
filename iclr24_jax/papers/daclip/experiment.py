"""DA-CLIP end to end at CPU scale: stage-0 CLIP -> DA-CLIP controller -> IR-SDE restorers -> PSNR / SSIM.

`run(config, workdir)` trains, evaluates and writes workdir/metrics.jsonl, results.json and plots. Each training
stage is one compiled `lax.scan` per chunk of `log_every` steps; the restorers of every (condition, seed) pair
are trained one after another through one compiled program (paired: a seed shares its init, batches and
sampling noise across conditions).  The reproduction and the benchmark that call this live in `study.py`.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.daclip import degradations as deg
from iclr24_jax.papers.daclip import irsde
from iclr24_jax.papers.daclip import model as model_lib
from iclr24_jax.vision import clip

PAPER = "daclip"
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
CONDITIONS = ("none", "daclip", "shuffled", "oracle")


def digit_captions(labels) -> list[str]:
  """Clean-content captions of digits: 'a handwritten digit seven'."""
  return [f"a handwritten digit {DIGIT_WORDS[int(k)]}" for k in labels]


# ----------------------------------------------------------------------------------------------------------------
# A chunked, compiled training loop over steps (batches drawn on device from arrays passed as arguments)
# ----------------------------------------------------------------------------------------------------------------


def _chunk_runner(step_fn: Callable, sample_fn: Callable, key: jax.Array) -> Callable:
  """run_chunk(state, data, start, n) -> (state, mean metrics): n steps as one jitted lax.scan (n static)."""

  @functools.partial(jax.jit, static_argnums=3)
  def run_chunk(state, data, start, n):
    def body(state, i):
      k = jax.random.fold_in(key, start + i)
      state, m = step_fn(state, sample_fn(data, k), k)
      return state, m
    state, ms = jax.lax.scan(body, state, jnp.arange(n))
    return state, jax.tree_util.tree_map(lambda v: jnp.mean(v, axis=0), ms)

  return run_chunk


def train_scan(step_fn: Callable | None, sample_fn: Callable | None, state: Any, data: Any, key: jax.Array,
               num_steps: int, chunk: int, writer: metrics_lib.MetricWriter | None = None, prefix: str = "train",
               progress: bool = True, runner: Callable | None = None) -> tuple[Any, list[dict]]:
  """Runs `num_steps` of state, metrics = step_fn(state, sample_fn(data, k), k) in jitted lax.scan chunks.

  Args:
    step_fn: pure train step (state, batch, key) -> (state, metrics).
    sample_fn: (data, key) -> batch (on device; data is a pytree of arrays).
    state: initial state (any pytree, e.g. a vmapped TrainState).
    data: arrays the batches are drawn from (passed as arguments, not baked into the program).
    key: PRNG key; step i uses fold_in(key, i).
    num_steps: steps in total; chunk: steps per compiled call (the last chunk may be shorter: one more compile).
    writer: optional MetricWriter; the mean metrics of each chunk are written at its last step.
    prefix: metric-name prefix.
    runner: a prebuilt `_chunk_runner` (reuse one compiled program across several runs of the same shapes).

  Returns:
    (final state, list of logged rows).
  """

  run_chunk = runner if runner is not None else _chunk_runner(step_fn, sample_fn, key)
  rows = []
  prog = metrics_lib.Progress(num_steps, name=prefix, enabled=progress)
  done = 0
  while done < num_steps:
    n = min(chunk, num_steps - done)
    state, m = run_chunk(state, data, done, n)
    done += n
    row = {f"{prefix}/{k}": float(np.mean(v)) for k, v in jax.device_get(m).items()}
    rows.append({"step": done, **row})
    if writer is not None:
      writer.write(done, row)
    prog.update(done, row.get(f"{prefix}/loss"))
  return state, rows


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_data(cfg: Any) -> dict:
  """Clean digits split into train / test (fixed shuffle by cfg.seed), the degraded train suite (uniform types)
  and a balanced test suite (test_per_type images of each type, distinct clean images)."""
  x, y = deg.load_clean_digits(int(cfg.data.image_size), cfg.data.name)
  order = np.random.default_rng(1234).permutation(len(x))
  x, y = x[order], y[order]
  n_train, n_test = int(cfg.data.num_train), int(cfg.data.num_test)
  n_types = len(deg.DEGRADATIONS)
  per_type = int(cfg.data.test_per_type)
  if n_train + n_test > len(x) or n_types * per_type > n_test:
    raise ValueError(f"data: num_train={n_train} + num_test={n_test} must fit {len(x)} images and num_test >= "
                     f"{n_types} x test_per_type={per_type}.")
  x_tr, y_tr = x[:n_train], y[:n_train]
  x_te, y_te = x[n_train:n_train + n_types * per_type], y[n_train:n_train + n_types * per_type]
  train = deg.make_suite(x_tr, seed=int(cfg.seed) * 1000 + 1, copies=int(cfg.data.train_copies))
  train["label"] = y_tr[train["index"]]
  test = deg.make_suite(x_te, seed=int(cfg.seed) * 1000 + 2, types=np.repeat(np.arange(n_types), per_type))
  test["label"] = y_te[test["index"]]
  return {"clean_x": x_tr, "clean_y": y_tr, "train": train, "test": test}


# ----------------------------------------------------------------------------------------------------------------
# Stage 0: CLIP on clean digits; stage 1: the controller
# ----------------------------------------------------------------------------------------------------------------


def train_clip(cfg: Any, data: dict, key: jax.Array, writer=None, progress=True) -> tuple[clip.CLIP, Any, Any]:
  """Stage 0: a small CLIP (ViT image tower, transformer text tower) on clean digits with captions.

  Args:
    cfg: the daclip ConfigDict (clip: model, optimizer, num_steps, batch_size; log_every).
    data: `load_data` output (clean_x [N, H, W, 1] in [0, 1], clean_y [N] digit labels).
    key: PRNG key.
    writer: optional MetricWriter for the loss curve.
    progress: print progress lines.

  Returns:
    (clip model, trained params, tokenizer).
  """
  names = list(deg.DEGRADATIONS)
  tok = clip.WordTokenizer.build(digit_captions(range(10)) + names)
  model = clip.create_clip(cfg.clip.model, tok.vocab_size)
  max_len = int(cfg.clip.model.text.max_len)
  cap_ids = jnp.asarray(tok.encode(digit_captions(range(10)), max_len))            # [10, L]
  steps = int(cfg.clip.num_steps)
  tx = clip.make_optimizer(cfg.clip.optimizer, steps)
  shape = data["clean_x"].shape[1:]
  state = jax.jit(lambda k: clip.init(k, model, shape, (max_len,), jnp.int32, tx))(key)
  bs = int(cfg.clip.batch_size)

  def sample(d, k):
    idx = jax.random.randint(k, (bs,), 0, d["x"].shape[0])
    return {"image": d["x"][idx], "text": cap_ids[d["y"][idx]]}

  arrays = {"x": jnp.asarray(data["clean_x"]), "y": jnp.asarray(data["clean_y"])}
  state, _ = train_scan(clip.make_train_step(model), sample, state, arrays, jax.random.fold_in(key, 1), steps,
                        max(1, int(cfg.log_every)), writer, "clip", progress)
  return model, state.params, tok


def text_tables(clip_model: clip.CLIP, clip_params: Any, tok: clip.WordTokenizer, max_len: int) -> tuple:
  """Frozen unit-norm text embeddings of the 10 digit captions [10, D] and the degradation names [K, D].

  Args:
    clip_model: the trained CLIP.
    clip_params: its params.
    tok: its WordTokenizer.
    max_len: token length of the text tower.

  Returns:
    (caption embeddings [10, D], degradation-name embeddings [K, D]) as jax arrays.
  """
  cap = clip.encode_texts(clip_model, clip_params, tok.encode(digit_captions(range(10)), max_len))
  names = clip.encode_texts(clip_model, clip_params, tok.encode(list(deg.DEGRADATIONS), max_len))
  return jnp.asarray(cap), jnp.asarray(names)


def train_controller(cfg: Any, clip_model: clip.CLIP, clip_params: Any, data: dict, cap_emb, name_emb,
                     key: jax.Array, writer=None, progress=True) -> tuple[model_lib.DaClip, Any]:
  """Stage 1: the DA-CLIP controller on the degraded train suite (the CLIP weights stay frozen).

  Args:
    cfg: the daclip ConfigDict (controller: optimizer, num_steps, batch_size; log_every).
    clip_model: the trained CLIP (ViT image tower).
    clip_params: its params.
    data: `load_data` output; data['train'] holds lq [N, H, W, 1], label [N] (digit), type [N] (degradation).
    cap_emb: [10, D] caption embeddings (`text_tables`).
    name_emb: [K, D] degradation-name embeddings.
    key: PRNG key.
    writer: optional MetricWriter.
    progress: print progress lines.

  Returns:
    (DaClip module, trained DaClip params).
  """
  dac = model_lib.daclip_from_clip(clip_model)
  params = model_lib.init_daclip_params(dac, clip_params, data["train"]["lq"].shape[1:])
  steps = int(cfg.controller.num_steps)
  state = TrainState.create(params, model_lib.make_controller_optimizer(cfg.controller.optimizer, steps, params))
  bs = int(cfg.controller.batch_size)

  def sample(d, k):
    idx = jax.random.randint(k, (bs,), 0, d["lq"].shape[0])
    return {"image": d["lq"][idx], "caption_emb": cap_emb[d["label"][idx]],
            "degradation_emb": name_emb[d["type"][idx]]}

  tr = data["train"]
  arrays = {k: jnp.asarray(tr[k]) for k in ("lq", "label", "type")}
  state, _ = train_scan(model_lib.make_controller_train_step(dac), sample, state, arrays, key, steps,
                        max(1, int(cfg.log_every)), writer, "controller", progress)
  return dac, state.params


@functools.lru_cache(maxsize=8)
def _embed_fn(dac: model_lib.DaClip):
  return jax.jit(lambda p, x: dac.apply({"params": p}, x) + (dac.apply({"params": p}, x, method="encode_frozen"),))


def embed(dac: model_lib.DaClip, params: Any, images: np.ndarray, batch_size: int = 512) -> dict[str, np.ndarray]:
  """e_c, e_d (DA-CLIP) and the frozen encoder's embedding e_frozen, each [N, D] unnormalised, in fixed batches.

  Args:
    dac: the DaClip module.
    params: its params.
    images: [N, H, W, C] float32 in [0, 1].
    batch_size: rows per compiled call (the last batch is zero-padded when N > batch_size).

  Returns:
    {'e_c', 'e_d', 'e_frozen'}: numpy [N, D] each.
  """
  fn = _embed_fn(dac)
  outs = {"e_c": [], "e_d": [], "e_frozen": []}
  n = len(images)
  for s in range(0, n, batch_size):
    xb = np.asarray(images[s:s + batch_size])
    pad = batch_size - len(xb) if n > batch_size else 0
    if pad:
      xb = np.concatenate([xb, np.zeros((pad,) + xb.shape[1:], xb.dtype)])
    e_c, e_d, e_f = jax.device_get(fn(params, jnp.asarray(xb)))
    for k, v in zip(("e_c", "e_d", "e_frozen"), (e_c, e_d, e_f)):
      outs[k].append(np.asarray(v)[:len(xb) - pad])
  return {k: np.concatenate(v) for k, v in outs.items()}


def degradation_accuracy(emb_train: dict, emb_test: dict, train: dict, test: dict, name_emb, cap_emb) -> dict:
  """Per-item correctness [N_test] of: e_d zero-shot (nearest degradation name), the frozen encoder zero-shot,
  a linear probe (logistic regression) on the frozen encoder's embedding, and digit (content) zero-shot
  from e_c vs the frozen encoder on the degraded test images.

  Args:
    emb_train: `embed` output of the train suite (the probe's training data).
    emb_test: `embed` output of the test suite.
    train: the train suite (type [N_train]).
    test: the test suite (type, label [N_test]).
    name_emb: [K, D] degradation-name embeddings.
    cap_emb: [10, D] caption embeddings.

  Returns:
    {'ed_zero_shot', 'frozen_zero_shot', 'frozen_linear_probe', 'content_ec', 'content_frozen'}:
    float [N_test] 0/1 arrays.
  """
  from sklearn.linear_model import LogisticRegression
  name_emb, cap_emb = np.asarray(name_emb), np.asarray(cap_emb)
  norm = lambda v: v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)  # noqa: E731
  out = {"ed_zero_shot": (np.argmax(norm(emb_test["e_d"]) @ name_emb.T, 1) == test["type"]).astype(float),
         "frozen_zero_shot": (np.argmax(norm(emb_test["e_frozen"]) @ name_emb.T, 1) == test["type"]).astype(float)}
  probe = LogisticRegression(max_iter=2000, C=1.0)
  probe.fit(norm(emb_train["e_frozen"]), train["type"])
  out["frozen_linear_probe"] = (probe.predict(norm(emb_test["e_frozen"])) == test["type"]).astype(float)
  out["content_ec"] = (np.argmax(norm(emb_test["e_c"]) @ cap_emb.T, 1) == test["label"]).astype(float)
  out["content_frozen"] = (np.argmax(norm(emb_test["e_frozen"]) @ cap_emb.T, 1) == test["label"]).astype(float)
  return out


# ----------------------------------------------------------------------------------------------------------------
# Stage 2: IR-SDE restorers for every (condition, seed), one compiled program
# ----------------------------------------------------------------------------------------------------------------


def condition_tables(emb: dict, types: np.ndarray, conditions, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-condition embeddings: cond (-> UNet `cond`, e_d's slot) and ctx (-> cross-attention, e_c's slot).

    none:     zeros for both (a zero vector is a constant input: the same function class as no embedding)
    daclip:   e_d, e_c
    shuffled: e_d of another image (a fixed random permutation), e_c
    oracle:   the one-hot degradation type (zero-padded to D), e_c

  Args:
    emb: `embed` output ({'e_c', 'e_d'} [N, D]).
    types: [N] int degradation types.
    conditions: C condition names from the list above.
    seed: seed of the 'shuffled' permutation.

  Returns:
    cond [C, N, D], ctx [C, N, D] float32.

  Raises:
    ValueError: an unknown condition, or D smaller than the number of degradation types.
  """
  e_c, e_d = np.asarray(emb["e_c"], np.float32), np.asarray(emb["e_d"], np.float32)
  n, d = e_d.shape
  if d < len(deg.DEGRADATIONS):
    raise ValueError(f"the oracle one-hot needs embed_dim >= {len(deg.DEGRADATIONS)}, got {d}.")
  perm = np.random.default_rng(seed).permutation(n)
  onehot = np.zeros((n, d), np.float32)
  onehot[np.arange(n), types] = 1.0
  zeros = np.zeros_like(e_d)
  table = {"none": (zeros, zeros), "daclip": (e_d, e_c), "shuffled": (e_d[perm], e_c), "oracle": (onehot, e_c)}
  unknown = [c for c in conditions if c not in table]
  if unknown:
    raise ValueError(f"unknown conditions {unknown}; choose from {tuple(table)}.")
  return (np.stack([table[c][0] for c in conditions]), np.stack([table[c][1] for c in conditions]))


def make_restorers(cfg: Any, image_shape, embed_dim: int):
  """The restorer module, its optimizer, the IR-SDE schedule and a per-model init(key) -> TrainState.

  Args:
    cfg: the daclip ConfigDict (model, sde: T, lambda_, schedule, eps; optimizer, num_steps).
    image_shape: (H, W, C) of the images.
    embed_dim: D of the cond / context embeddings.

  Returns:
    (net, sde schedule, tx, init): init(key) -> TrainState of one restorer (input [1, H, W, 2 C]).
  """
  net = model_lib.create_restorer(cfg.model)
  sde = irsde.irsde_schedule(int(cfg.sde.T), float(cfg.sde.lambda_), cfg.sde.schedule, float(cfg.sde.eps))
  tx = make_optimizer(cfg.optimizer, int(cfg.num_steps))
  h, w, c = image_shape

  def init(key):
    x = jnp.zeros((1, h, w, 2 * c))
    e = jnp.zeros((1, embed_dim))
    params = net.init(key, x, jnp.ones((1,)), cond=e, context=e[:, None])["params"]
    return TrainState.create(params, tx)

  return net, sde, tx, init


def train_restorers(cfg: Any, data: dict, cond_tab, ctx_tab, key: jax.Array, writer=None, progress=True):
  """Trains C x S restorers (conditions x seeds) with one compiled program.

  Model m = (condition m // S, seed m % S); the seed fixes the init, the batch indices and the time / noise
  draws, shared by the conditions (paired comparisons). The models run one after another through the same
  compiled chunk (condition and seed are traced arguments): on CPU a vmap over models turns every convolution
  into a grouped convolution, which XLA:CPU runs far slower than C x S plain ones.

  Args:
    cfg: the daclip ConfigDict (num_seeds S, batch_size, num_steps, log_every, conditions, ...).
    data: `load_data` output (train: gt, lq [N, H, W, C]).
    cond_tab: [C, N, D] cond embeddings (`condition_tables`).
    ctx_tab: [C, N, D] context embeddings.
    key: PRNG key.
    writer: optional MetricWriter.
    progress: print progress lines.

  Returns:
    (net, sde, stacked TrainState with leading axis C * S).
  """
  n_cond, s = cond_tab.shape[0], int(cfg.num_seeds)
  tr = data["train"]
  net, sde, _, init = make_restorers(cfg, tr["lq"].shape[1:], cond_tab.shape[-1])
  key_init, key_train = jax.random.split(key)
  init_jit = jax.jit(lambda s_idx: init(jax.random.fold_in(key_init, s_idx)))
  step_one = model_lib.make_restoration_train_step(net, sde)
  bs = int(cfg.batch_size)

  def sample(d, k):
    del k
    return d

  def step(state, d, k):
    del k
    ks = jax.random.fold_in(jax.random.fold_in(key_train, d["seed"]), state.step)
    idx = jax.random.randint(ks, (bs,), 0, d["lq"].shape[0])
    batch = {"gt": d["gt"][idx], "lq": d["lq"][idx], "e_d": d["cond"][d["cond_idx"], idx],
             "e_c": d["ctx"][d["cond_idx"], idx]}
    return step_one(state, batch, jax.random.fold_in(ks, 1))

  arrays = {"gt": jnp.asarray(tr["gt"]), "lq": jnp.asarray(tr["lq"]), "cond": jnp.asarray(cond_tab),
            "ctx": jnp.asarray(ctx_tab)}
  chunk = max(1, int(cfg.log_every))
  runner = _chunk_runner(step, sample, key_train)
  states = []
  for c_idx in range(n_cond):
    for s_idx in range(s):
      d = {**arrays, "cond_idx": jnp.int32(c_idx), "seed": jnp.int32(s_idx)}
      state, _ = train_scan(None, None, init_jit(s_idx), d, key_train, int(cfg.num_steps), chunk, writer,
                            f"restorer_{cfg.conditions[c_idx]}_s{s_idx}", progress, runner=runner)
      states.append(state)
  return net, sde, jax.tree_util.tree_map(lambda *v: jnp.stack(v), *states)


def restore_all(cfg: Any, net, sde, params, test: dict, cond_tab, ctx_tab, key: jax.Array,
                batch_size: int = 256) -> np.ndarray:
  """Restored test images [C * S, N, H, W, 1] from every model (paired sampling noise per seed); one compiled
  reverse-SDE chain, called per model and batch.

  Args:
    cfg: the daclip ConfigDict (num_seeds S, restore_method 'sde' | 'posterior').
    net: the restorer UNet.
    sde: IRSDESchedule.
    params: stacked restorer params (leading axis C * S).
    test: the test suite (lq [N, H, W, C]).
    cond_tab: [C, N, D] test cond embeddings.
    ctx_tab: [C, N, D] test context embeddings.
    key: PRNG key (folded with the seed and batch start).
    batch_size: images per call (the last batch is zero-padded).

  Returns:
    numpy [C * S, N, H, W, C] restorations (not clipped).
  """
  n_cond, s = cond_tab.shape[0], int(cfg.num_seeds)
  method = cfg.get("restore_method", "sde")

  @jax.jit
  def run(p, lq, cond, ctx, s_idx, start):
    k = jax.random.fold_in(jax.random.fold_in(key, s_idx), start)
    return model_lib.restore(k, p, lq, model=net, schedule=sde, e_c=ctx, e_d=cond, method=method)

  n = len(test["lq"])
  bs = min(batch_size, n)
  outs = []
  for m in range(n_cond * s):
    c_idx, s_idx = divmod(m, s)
    p = jax.tree_util.tree_map(lambda v: v[m], params)
    per_model = []
    for st in range(0, n, bs):
      sl = slice(st, st + bs)
      lq, cond, ctx = test["lq"][sl], cond_tab[c_idx, sl], ctx_tab[c_idx, sl]
      pad = bs - len(lq)
      if pad:
        lq = np.concatenate([lq, np.zeros((pad,) + lq.shape[1:], lq.dtype)])
        cond = np.concatenate([cond, np.zeros((pad, cond.shape[-1]), cond.dtype)])
        ctx = np.concatenate([ctx, np.zeros((pad, ctx.shape[-1]), ctx.dtype)])
      out = run(p, jnp.asarray(lq), jnp.asarray(cond), jnp.asarray(ctx), s_idx, st)
      per_model.append(np.asarray(jax.device_get(out))[:bs - pad])
    outs.append(np.concatenate(per_model))
  return np.stack(outs)


def score(restored: np.ndarray, test: dict, conditions, num_seeds: int) -> dict:
  """PSNR / SSIM per (condition, seed, image) -> nested dict with per-seed means and per-degradation means.

  Args:
    restored: [C * S, N, H, W, C] restorations (clipped to [0, 1] here).
    test: the test suite (gt, lq [N, H, W, C] in [0, 1], type [N]).
    conditions: C condition names, in the models' order.
    num_seeds: S.

  Returns:
    {'per_condition': {condition: {psnr: [S], ssim: [S], per_type: {degradation: {psnr: [S], ssim: [S]}}}},
     'input': {psnr, ssim, per_type} of the degraded inputs}.
  """
  n_cond = len(conditions)
  gt = test["gt"]
  res = {"per_condition": {}, "input": {}}
  for ci, cname in enumerate(conditions):
    per_seed_psnr, per_seed_ssim, per_type = [], [], {}
    psnr_all, ssim_all = [], []
    for si in range(num_seeds):
      x = np.clip(restored[ci * num_seeds + si], 0.0, 1.0)
      p, s = metrics_lib.psnr_ssim(x, gt, value_range=(0.0, 1.0))
      psnr_all.append(p)
      ssim_all.append(s)
      per_seed_psnr.append(float(p.mean()))
      per_seed_ssim.append(float(s.mean()))
    psnr_all, ssim_all = np.stack(psnr_all), np.stack(ssim_all)                  # [S, N]
    for k, name in enumerate(deg.DEGRADATIONS):
      m = test["type"] == k
      per_type[name] = {"psnr": psnr_all[:, m].mean(1).tolist(), "ssim": ssim_all[:, m].mean(1).tolist()}
    res["per_condition"][cname] = {"psnr": per_seed_psnr, "ssim": per_seed_ssim, "per_type": per_type}
  p_in, s_in = metrics_lib.psnr_ssim(test["lq"], gt, value_range=(0.0, 1.0))
  res["input"] = {"psnr": float(p_in.mean()), "ssim": float(s_in.mean()),
                  "per_type": {name: {"psnr": float(p_in[test["type"] == k].mean()),
                                      "ssim": float(s_in[test["type"] == k].mean())}
                               for k, name in enumerate(deg.DEGRADATIONS)}}
  del n_cond
  return res


def plot_examples(test: dict, restored: np.ndarray, conditions, num_seeds: int, path: str) -> str:
  """One row per degradation: clean, degraded, then each condition's restoration (seed 0).

  Args:
    test: the test suite (gt, lq, type).
    restored: [C * S, N, H, W, C] restorations.
    conditions: C condition names.
    num_seeds: S.
    path: PNG output path.

  Returns:
    path.
  """
  rows = []
  for k in range(len(deg.DEGRADATIONS)):
    i = int(np.where(test["type"] == k)[0][0])
    rows += [test["gt"][i], test["lq"][i]] + [restored[ci * num_seeds, i] for ci in range(len(conditions))]
  return metrics_lib.plot_image_grid(np.clip(np.stack(rows), 0, 1), path, ncols=2 + len(conditions),
                                     title="clean | degraded | " + " | ".join(conditions))


def plot_psnr_by_type(scores: dict, conditions, path: str) -> str:
  """Grouped bars of PSNR per degradation type: the degraded input, then each condition (mean over seeds).

  Args:
    scores: `score` output.
    conditions: condition names to plot.
    path: PNG output path.

  Returns:
    path.
  """
  fig, axes = metrics_lib.new_figure(size=(7.0, 3.2))
  ax = axes[0, 0]
  names = list(deg.DEGRADATIONS)
  width = 0.8 / (len(conditions) + 1)
  xs = np.arange(len(names))
  ax.bar(xs, [scores["input"]["per_type"][n]["psnr"] for n in names], width, label="degraded input", color="0.7")
  for ci, c in enumerate(conditions):
    vals = [np.mean(scores["per_condition"][c]["per_type"][n]["psnr"]) for n in names]
    ax.bar(xs + (ci + 1) * width, vals, width, label=c)
  ax.set_xticks(xs + 0.4)
  ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
  ax.set_ylabel("PSNR (dB)")
  ax.legend(fontsize=6)
  return metrics_lib.save_figure(fig, path)


# ----------------------------------------------------------------------------------------------------------------
# run
# ----------------------------------------------------------------------------------------------------------------


def run(config: ml_collections.ConfigDict, workdir: str, progress: bool = True) -> dict:
  """Stage 0 CLIP -> stage 1 controller -> degradation accuracy -> stage 2 restorers -> PSNR / SSIM.

  Returns (and writes to workdir/results.json): degradation / content accuracies (means and per-item 0/1
  lists), PSNR / SSIM per condition (per seed, per degradation), the degraded inputs' PSNR / SSIM, timings
  and plot paths.

  Args:
    config: the daclip ConfigDict (`configs/daclip.py`); restoration=False skips stage 2.
    workdir: output folder (created).
    progress: print progress lines.
  """
  t0 = time.time()
  os.makedirs(workdir, exist_ok=True)
  writer = metrics_lib.MetricWriter(workdir)
  key = jax.random.key(int(config.seed))
  key_clip, key_ctrl, key_rest, key_sample = jax.random.split(key, 4)
  conditions = tuple(config.conditions)
  data = load_data(config)
  timings = {}

  t = time.time()
  clip_model, clip_params, tok = train_clip(config, data, key_clip, writer, progress)
  cap_emb, name_emb = text_tables(clip_model, clip_params, tok, int(config.clip.model.text.max_len))
  timings["clip_s"] = time.time() - t
  t = time.time()
  dac, dac_params = train_controller(config, clip_model, clip_params, data, cap_emb, name_emb, key_ctrl, writer,
                                     progress)
  timings["controller_s"] = time.time() - t

  t = time.time()
  emb_train = embed(dac, dac_params, data["train"]["lq"])
  emb_test = embed(dac, dac_params, data["test"]["lq"])
  acc = degradation_accuracy(emb_train, emb_test, data["train"], data["test"], name_emb, cap_emb)
  timings["embed_s"] = time.time() - t

  results = {"paper": PAPER, "degradations": list(deg.DEGRADATIONS), "conditions": list(conditions),
             "accuracy": {k: float(v.mean()) for k, v in acc.items()},
             "accuracy_items": {k: v.tolist() for k, v in acc.items()},
             "name_emb_max_cos": float(np.max(np.asarray(name_emb) @ np.asarray(name_emb).T
                                              - 2 * np.eye(len(deg.DEGRADATIONS)))),
             "num_test": int(len(data["test"]["lq"])), "num_train": int(len(data["train"]["lq"])),
             "timings": timings, "plots": []}
  if config.get("restoration", True):
    t = time.time()
    cond_tr, ctx_tr = condition_tables(emb_train, data["train"]["type"], conditions, seed=int(config.seed) + 11)
    cond_te, ctx_te = condition_tables(emb_test, data["test"]["type"], conditions, seed=int(config.seed) + 12)
    net, sde, states = train_restorers(config, data, cond_tr, ctx_tr, key_rest, writer, progress)
    timings["restorers_s"] = time.time() - t
    t = time.time()
    restored = restore_all(config, net, sde, states.params, data["test"], cond_te, ctx_te, key_sample)
    timings["restore_s"] = time.time() - t
    scores = score(restored, data["test"], conditions, int(config.num_seeds))
    results["restoration"] = scores
    results["plots"] = [plot_examples(data["test"], restored, conditions, int(config.num_seeds),
                                      os.path.join(workdir, "restorations.png")),
                        plot_psnr_by_type(scores, conditions, os.path.join(workdir, "psnr_by_degradation.png"))]
  results["wall_s"] = time.time() - t0
  metrics_lib.write_results(workdir, results)
  return results
