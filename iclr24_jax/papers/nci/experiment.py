"""nci experiments: one adaptation run through the shared loop, and the seed-batched leave-one-out runs.

The reproduction study and the benchmark are in `study.py`.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.papers.nci import data as data_lib
from iclr24_jax.papers.nci import model as model_lib
from iclr24_jax.papers.nci import train as train_lib

METHODS = ("erm", "dann", "nci", "oracle")
SCHEDULES = ("official", "ramp", "constant")


def adv_weight(config: Any, num_sources: int) -> float:
  """lambda; None/negative in the config means the official code's 1/K."""
  w = config.get("adv_weight", None)
  return 1.0 / num_sources if (w is None or w < 0) else float(w)


def ramp_steps(config: Any, method: str) -> int | None:
  """Steps of the lambda ramp for a method under config.adv_schedule, or None for a constant lambda.

  'official': NCI at a constant lambda (the official code), DANN on Ganin et al.'s ramp; 'ramp': both on
  the ramp; 'constant': both constant. 'ramp' and 'constant' give NCI and DANN the same schedule.
  """
  sched = config.get("adv_schedule", "official")
  if sched not in SCHEDULES:
    raise ValueError(f"unknown adv_schedule '{sched}'; choose one of {SCHEDULES}.")
  if sched == "constant" or (sched == "official" and method != "dann"):
    return None
  return int(config.num_steps)


def _setup(config: Any, target: str, method: str):
  names = tuple(config.data.domains)
  if target not in names:
    raise ValueError(f"target domain '{target}' is not among config.data.domains {names}.")
  domains = data_lib.make_domains(names, config.data.image_size, max_per_domain=config.data.get("max_per_domain"))
  tgt = domains[names.index(target)]
  uda, evl = data_lib.split_target(tgt, config.data.uda_fraction, seed=0)
  sources = [d for d in domains if d.name != target]
  if method == "oracle":  # ERM that also sees the target's adaptation split *with* labels
    sources = sources + [uda]
  nets = model_lib.make_networks(config.model, 10, len(sources))
  tx_model = make_optimizer(config.optimizer, config.num_steps)
  tx_disc = make_optimizer(config.optimizer, config.num_steps)
  return sources, uda, evl, nets, tx_model, tx_disc


def make_train_fn(nets: model_lib.Networks, method: str, weight: float, tx_model, tx_disc, num_steps: int,
                  batch_size: int, input_shape: tuple[int, ...], ramp: int | None = None):
  """Whole training runs of S seeds at once (a vmap over seeds) with on-device batch sampling.

  Args:
    nets, method, weight: the networks, 'erm' | 'dann' | 'nci' | 'oracle' and lambda.
    tx_model, tx_disc: optimizers; num_steps, batch_size: the budget; input_shape: (H, W, C).
    ramp: steps of the lambda ramp (see `ramp_steps`), None for a constant lambda.

  Returns:
    train(keys [S], src_x [K, N, ...], src_y [K, N], src_n [K], tgt_x [M, ...]) -> (params [S, ...],
    metrics [S, T]). Seed s's init and batches depend on keys[s] only, so methods given the same keys
    are paired by seed.

  Deviation from the library's usual "whole run in one `lax.scan`": XLA:CPU runs conv backward passes
  40-80x slower inside a while loop than in a plain jitted call (measured with jax 0.9.2), so the
  steps are a Python loop over one jitted step that samples its own batch on device; with
  `scan=True` (accelerators) the same step runs under `lax.scan`.
  """
  step = train_lib.make_train_step(nets, "erm" if method == "oracle" else method, weight, ramp_steps=ramp or 0)

  def sampled_step(state, i, key_data, src_x, src_y, src_n, tgt_x):
    k = src_x.shape[0]
    key_s, key_t = jax.random.split(jax.random.fold_in(key_data, i))
    idx = (jax.random.uniform(key_s, (k, batch_size)) * src_n[:, None]).astype(jnp.int32)
    rows = jnp.arange(k)[:, None]
    it = jax.random.randint(key_t, (batch_size,), 0, tgt_x.shape[0])
    state, m = step(state, {"x": src_x[rows, idx], "y": src_y[rows, idx]}, tgt_x[it], key_t)
    return state, {"loss": m["loss"], "nll": m["nll"], "d_acc": m["d_acc"]}

  seeds_step = jax.vmap(sampled_step, in_axes=(0, None, 0, None, None, None, None))
  init_fn = jax.jit(jax.vmap(lambda key: model_lib.init(key, nets, input_shape, tx_model, tx_disc)))
  step_fn = jax.jit(seeds_step, donate_argnums=0)

  def train(keys, src_x, src_y, src_n, tgt_x, scan: bool = False):
    key_init, key_data = jax.vmap(lambda k: tuple(jax.random.split(k)))(keys)
    state = init_fn(key_init)
    if scan:
      body = lambda st, i: seeds_step(st, i, key_data, src_x, src_y, src_n, tgt_x)
      state, ms = jax.jit(lambda st: jax.lax.scan(body, st, jnp.arange(num_steps)))(state)
      return state.params, jax.tree.map(lambda m: jnp.swapaxes(m, 0, 1), ms)
    ms = []
    for i in range(num_steps):
      state, m = step_fn(state, i, key_data, src_x, src_y, src_n, tgt_x)
      ms.append(m)
    return state.params, jax.tree.map(lambda *xs: jnp.stack(xs, 1), *ms)

  return train


def leave_one_out(config: Any, target: str, method: str, seeds: int, weight: float | None = None,
                  vmap_seeds: bool | str = "auto") -> dict:
  """Trains `seeds` runs of a method for one target domain -> accuracies per seed.

  Args:
    config: the nci config (adv_schedule picks the lambda schedule, see `ramp_steps`).
    target: the held-out domain; method: 'erm' | 'dann' | 'nci' | 'oracle'; seeds: S.
    weight: lambda (default `adv_weight(config, K)`).
    vmap_seeds: True runs the S seeds as one vmapped program; False one seed at a time (the same program
      with S = 1); 'auto' = vmap on GPU/TPU only: on XLA:CPU a vmap over seeds turns the convolutions into
      grouped ones, and 3 vmapped seeds cost 6x one seed (measured), twice the cost of running them in turn.

  Returns:
    dict(target_acc [S], source_acc (mean), final_d_acc (mean)); seed s uses fold_in(key(config.seed), s)
    for every method, so methods are paired by seed (same init, same batches).
  """
  sources, uda, evl, nets, tx_m, tx_d = _setup(config, target, method)
  sx, sy, sn = data_lib.stack_padded(sources)
  lam = adv_weight(config, len(sources)) if weight is None else float(weight)
  train = make_train_fn(nets, method, lam, tx_m, tx_d, config.num_steps, config.batch_size, sx.shape[2:],
                        ramp=ramp_steps(config, method))
  sx, sy, sn, ux = map(jnp.asarray, (sx, sy, sn, uda.x))
  acc_fn = jax.jit(jax.vmap(lambda p, x, y: jnp.mean(jnp.argmax(nets.features_and_logits(p["model"], x)[1], -1) == y),
                            in_axes=(0, None, None)))
  keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(config.seed), s))(jnp.arange(seeds))
  if vmap_seeds == "auto":
    vmap_seeds = jax.default_backend() != "cpu"
  chunk = seeds if vmap_seeds else 1
  tgt_acc, src_acc, d_acc = [], [], []
  for start in range(0, seeds, chunk):
    params, ms = train(keys[start:start + chunk], sx, sy, sn, ux)
    tgt_acc.append(np.asarray(acc_fn(params, evl.x, evl.y)))
    src_acc.append(np.mean([np.asarray(acc_fn(params, d.x, d.y)) for d in sources], axis=0))
    d_acc.append(np.asarray(ms["d_acc"][:, -50:]).mean(1))
  tgt_acc, src_acc, d_acc = map(np.concatenate, (tgt_acc, src_acc, d_acc))
  return {"target_acc": tgt_acc.astype(np.float64), "source_acc": float(np.mean(src_acc)),
          "final_d_acc": float(np.mean(d_acc))}


def run(config: Any, workdir: str) -> dict:
  """One method on one target domain through the shared loop (metrics, checkpoints, resume, plots)."""
  method, target = config.method, config.data.target
  if method not in METHODS:
    raise ValueError(f"unknown method '{method}'; choose one of {METHODS}.")
  sources, uda, evl, nets, tx_m, tx_d = _setup(config, target, method)
  sx, sy, sn = data_lib.stack_padded(sources)
  k, bs = len(sources), config.batch_size
  step = train_lib.make_train_step(nets, "erm" if method == "oracle" else method, adv_weight(config, k),
                             ramp_steps=ramp_steps(config, method) or 0)
  input_shape = sx.shape[2:]

  def batches(s):  # deterministic in the step, so a resumed run sees the same data
    rng = np.random.default_rng([config.seed, s])
    idx = (rng.random((k, bs)) * sn[:, None]).astype(np.int64)
    it = rng.integers(0, len(uda.y), bs)
    return {"sx": np.swapaxes(sx[np.arange(k)[:, None], idx], 0, 1), "sy": sy[np.arange(k)[:, None], idx].T,
            "tx": uda.x[it]}

  def loop_step(state, batch, key):  # batch rows lead (sharded over 'data'); the method wants [K, B]
    src = {"x": jnp.swapaxes(batch["sx"], 0, 1), "y": batch["sy"].T}
    return step(state, src, batch["tx"], key)

  def eval_fn(state):
    return {"target_acc": train_lib.evaluate(nets, state.params, evl.x, evl.y)}

  res = loop_lib.train_loop(
      init_fn=lambda key: model_lib.init(key, nets, input_shape, tx_m, tx_d), train_step=loop_step, batches=batches,
      num_steps=config.num_steps, key=jax.random.key(config.seed), workdir=workdir,
      mesh=sharding.make_mesh(config.get("mesh")), log_every=config.log_every, eval_every=config.eval_every,
      eval_fn=eval_fn, checkpoint_every=config.checkpoint_every, config=config, name=f"nci/{method}")
  src_acc = float(np.mean([train_lib.evaluate(nets, res.state.params, d.x, d.y) for d in sources]))
  results = {"method": method, "target": target, "target_acc": res.final_eval["eval/target_acc"],
             "source_acc": src_acc, "resumed_from_step": res.start_step, "steps_per_s": res.steps_per_s}
  metrics_lib.write_results(workdir, results)
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  metrics_lib.plot_curves(rows, ["train/nll", "train/d_acc", "eval/target_acc"], os.path.join(workdir, "curves.png"),
                          title=f"{method}: target {target}")
  return results
