"""DA-CLIP stage 2, the IR-SDE restoration pipeline: restorers for every (condition, seed), restoring, scoring.

`condition_tables` (the embeddings each condition feeds the restorer: none / daclip / shuffled / oracle),
`make_restorers`, `train_restorers` (C x S restorers through one compiled program, paired by seed),
`heldout_draws` / `make_heldout_eval` (the matching loss on held-out images, the same draws for every model),
`restore_all` (reverse IR-SDE sampling of the test set, the mean of K chains) and `score` (PSNR / SSIM per
condition, seed and degradation). The IR-SDE itself is in `irsde.py`; stages 0-1 in `train.py`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.daclip import degradations as deg
from iclr24_jax.papers.daclip import irsde
from iclr24_jax.papers.daclip import model as model_lib
from iclr24_jax.papers.daclip.train import chunk_runner, stage, train_scan


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


def heldout_draws(key: jax.Array, num_images: int, image_shape, num_steps: int, num_times: int
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Fixed (time, forward noise) draws for the held-out matching loss: R stratified times per image.

  Draw r of every image falls in the r-th of R equal strata of 1..T (uniform inside it), so the R draws cover the
  schedule evenly, as the uniform t of training does on average, with less variance. Every model is evaluated on
  these same draws (the comparisons between conditions are paired draw by draw).

  Args:
    key: PRNG key (the evaluation's own: not a training key).
    num_images: N.
    image_shape: (H, W, C).
    num_steps: T.
    num_times: R, 1 <= R <= T.

  Returns:
    (times [N, R] int32 in 1..T, noise [N, R, H, W, C] float32) as numpy arrays.

  Raises:
    ValueError: R outside 1..T.
  """
  if not 1 <= int(num_times) <= int(num_steps):
    raise ValueError(f"num_times={num_times} must be in 1..T={num_steps} (one draw per stratum of the T times).")
  key_t, key_z = jax.random.split(key)
  r = np.arange(int(num_times))
  lo = 1 + (r * num_steps) // num_times                        # stratum r: lo..hi inclusive
  hi = ((r + 1) * num_steps) // num_times
  u = np.asarray(jax.random.uniform(key_t, (num_images, int(num_times))))
  times = (lo + np.floor(u * (hi - lo + 1))).astype(np.int32)
  times = np.minimum(times, hi).astype(np.int32)               # u < 1, but keep float rounding inside the stratum
  noise = np.asarray(jax.random.normal(key_z, (num_images, int(num_times)) + tuple(image_shape)), np.float32)
  return times, noise


def make_heldout_eval(net, sde: irsde.IRSDESchedule):
  """A compiled fn(params, gt, lq, cond [N, D], ctx [N, D], times [N, R], noise) -> [N] per-image matching loss
  (`model.heldout_matching_loss`; cond -> e_d's slot, ctx -> e_c's, as in training)."""
  @jax.jit
  def fn(params, gt, lq, cond, ctx, times, noise):
    batch = {"gt": gt, "lq": lq, "e_d": cond, "e_c": ctx}
    return model_lib.heldout_matching_loss(params, net, batch, times, noise, sde)
  return fn


def train_restorers(cfg: Any, data: dict, cond_tab, ctx_tab, key: jax.Array, writer=None, progress=True,
                    heldout: dict | None = None, stages: loop_lib.Stages | None = None):
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
    heldout: optional {'gt', 'lq' [N, H, W, C], 'cond', 'ctx' [C, N, D], 'times' [N, R], 'noise' [N, R, H, W, C]}:
      the held-out matching loss of every model is evaluated after every chunk of `log_every` steps on these
      fixed draws (logged as restorer_<condition>_s<seed>/heldout_loss).
    stages: where each model's stage `restorer_<condition>_s<seed>` saves and resumes (`train_scan`'s lp); the
      curve is read from the stage's logged rows, so a resumed model reports the curve of an uninterrupted one.
      None: nothing saved.

  Returns:
    (net, sde, stacked TrainState with leading axis C * S, heldout): heldout is None without `heldout`, else
    {'steps': [K] step counts, 'curve': [C * S, K] mean held-out loss after each chunk, 'per_image': [C * S, N]
    per-image loss of the final models}.

  Raises:
    common.loop.Preempted: SIGTERM / SIGINT stopped a model's stage (its checkpoint is saved).
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
  runner = chunk_runner(step, sample, key_train)
  evaluate = make_heldout_eval(net, sde) if heldout is not None else None
  states, curves, finals, steps = [], [], [], []
  for c_idx in range(n_cond):
    for s_idx in range(s):
      d = {**arrays, "cond_idx": jnp.int32(c_idx), "seed": jnp.int32(s_idx)}
      name = f"restorer_{cfg.conditions[c_idx]}_s{s_idx}"

      def heldout_loss(state, c_idx=c_idx):                       # [N] per-image loss on the fixed draws
        return np.asarray(jax.device_get(evaluate(
            state.params, heldout["gt"], heldout["lq"], heldout["cond"][c_idx], heldout["ctx"][c_idx],
            heldout["times"], heldout["noise"])))

      last = {}

      def on_chunk(state, done, last=last, heldout_loss=heldout_loss):
        del done
        last["per_image"] = heldout_loss(state)
        return {"heldout_loss": last["per_image"].mean()}

      with stage(stages, name, int(cfg.num_steps)) as lp:
        state, rows = train_scan(None, None, init_jit(s_idx), d, key_train, int(cfg.num_steps), chunk, writer,
                                 name, progress, runner=runner, on_chunk=on_chunk if evaluate is not None else None,
                                 lp=lp)
      states.append(state)
      if evaluate is not None:
        steps = [r["step"] for r in rows]
        curves.append([r[f"{name}/heldout_loss"] for r in rows])
        # The final models' losses: the last chunk's, or (a finished stage restored) the same program on the
        # restored parameters.
        finals.append(last["per_image"] if "per_image" in last else heldout_loss(state))
  out = None if evaluate is None else {"steps": steps, "curve": np.asarray(curves), "per_image": np.stack(finals)}
  return net, sde, jax.tree_util.tree_map(lambda *v: jnp.stack(v), *states), out


def restore_all(cfg: Any, net, sde, params, test: dict, cond_tab, ctx_tab, key: jax.Array,
                batch_size: int = 256, conditions: tuple[int, ...] | None = None,
                num_samples: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """Restored test images from the models of the chosen conditions: the mean of `num_samples` reverse chains
  (an estimate of the posterior mean) and the first chain alone; one compiled chain, called per model, batch and
  chain. The sampling noise depends on the seed, batch and chain only: paired across conditions.

  Chain k of a batch uses fold_in(k_batch, k), as `irsde.reverse_sample_mean` does, so the mean equals
  `model.restore(k_batch, ..., num_samples=K)`; the chains run as a host loop to keep chain 0 as well.

  Args:
    cfg: the daclip ConfigDict (num_seeds S, restore_method 'posterior' (official) | 'sde').
    net: the restorer UNet.
    sde: IRSDESchedule.
    params: stacked restorer params (leading axis C * S).
    test: the test suite (lq [N, H, W, C]).
    cond_tab: [C, N, D] test cond embeddings.
    ctx_tab: [C, N, D] test context embeddings.
    key: PRNG key (folded with the seed and batch start).
    batch_size: images per call (the last batch is zero-padded).
    conditions: indices (into the C conditions) to restore; None = all.
    num_samples: K chains averaged per image.

  Returns:
    (mean [C' * S, N, H, W, C], first chain [C' * S, N, H, W, C]) numpy restorations (not clipped), C' the
    chosen conditions in the given order.
  """
  n_cond, s = cond_tab.shape[0], int(cfg.num_seeds)
  method = cfg.get("restore_method", "posterior")
  conditions = tuple(range(n_cond)) if conditions is None else tuple(int(c) for c in conditions)
  if int(num_samples) < 1:
    raise ValueError(f"num_samples must be >= 1, got {num_samples}.")

  @jax.jit
  def run(p, lq, cond, ctx, s_idx, start, chain):
    k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, s_idx), start), chain)
    return model_lib.restore(k, p, lq, model=net, schedule=sde, e_c=ctx, e_d=cond, method=method)

  n = len(test["lq"])
  bs = min(batch_size, n)
  means, firsts = [], []
  for c_idx in conditions:
    for s_idx in range(s):
      p = jax.tree_util.tree_map(lambda v, m=c_idx * s + s_idx: v[m], params)
      mean_m, first_m = [], []
      for st in range(0, n, bs):
        sl = slice(st, st + bs)
        lq, cond, ctx = test["lq"][sl], cond_tab[c_idx, sl], ctx_tab[c_idx, sl]
        pad = bs - len(lq)
        if pad:
          lq = np.concatenate([lq, np.zeros((pad,) + lq.shape[1:], lq.dtype)])
          cond = np.concatenate([cond, np.zeros((pad, cond.shape[-1]), cond.dtype)])
          ctx = np.concatenate([ctx, np.zeros((pad, ctx.shape[-1]), ctx.dtype)])
        chains = [np.asarray(jax.device_get(run(p, jnp.asarray(lq), jnp.asarray(cond), jnp.asarray(ctx), s_idx, st,
                                                k)))[:bs - pad] for k in range(int(num_samples))]
        mean_m.append(np.mean(chains, axis=0))
        first_m.append(chains[0])
      means.append(np.concatenate(mean_m))
      firsts.append(np.concatenate(first_m))
  return np.stack(means), np.stack(firsts)


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
