"""Training: one shared step structure, three model losses (NCI, ERM, DANN); evaluation; the seed-batched runs.

Steps: `make_train_step` / `train_step` / `erm_step` / `dann_step`, `evaluate`. Whole runs: `setup` (data, networks,
optimizers of one leave-one-domain-out run), `adv_weight` / `ramp_steps` (lambda and its schedule),
`make_train_fn` (S seeds of a whole training run) and `leave_one_out` (S seeds of one (target, method) ->
accuracies), which the study (`study.py`) calls. `experiment.run` is the one-run launcher through the shared loop.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.papers.nci import data as data_lib
from iclr24_jax.papers.nci import losses
from iclr24_jax.papers.nci import model as model_lib
from iclr24_jax.papers.nci.model import AdversarialState, Networks

MODEL_LOSSES = {"nci": losses.loss_fn, "erm": losses.erm_model_loss, "dann": losses.dann_model_loss}


def _check(source_x: jax.Array, source_y: jax.Array, target_x: jax.Array) -> None:
  if source_x.ndim != 5 or source_y.shape != source_x.shape[:2]:
    raise ValueError(f"source_x must be [K, B, H, W, C] and source_y [K, B]; got {source_x.shape} and "
                     f"{source_y.shape}.")
  if target_x.ndim != 4 or target_x.shape[1:] != source_x.shape[2:]:
    raise ValueError(f"target_x must be [B_t, H, W, C] matching the source images {source_x.shape[2:]}; got "
                     f"{target_x.shape}.")


def _as_arrays(source_batches: Any) -> tuple[jax.Array, jax.Array]:
  """Accepts {'x': [K, B, ...], 'y': [K, B]} or a list of (x, y) per source domain."""
  if isinstance(source_batches, dict):
    return source_batches["x"], source_batches["y"]
  xs, ys = zip(*source_batches)
  return jnp.stack(xs), jnp.stack(ys)


def dann_lambda(step: jax.Array, num_steps: int) -> jax.Array:
  """Ganin et al. (2016)'s DANN ramp 2 / (1 + exp(-10 p)) - 1, p = step / num_steps (0 -> 1)."""
  p = jnp.clip(step / max(num_steps, 1), 0.0, 1.0)
  return 2.0 / (1.0 + jnp.exp(-10.0 * p)) - 1.0


def _step(state: AdversarialState, source_batches: Any, target_batch: Any, key: jax.Array, *, nets: Networks,
          method: str, adv_weight: float, ramp_steps: int | None = None) -> tuple[AdversarialState, dict]:
  del key  # no stochastic layers; kept for the library's step signature
  if ramp_steps:  # Ganin et al.'s ramp on lambda (DANN's schedule; with schedule='ramp' NCI's too)
    adv_weight = adv_weight * dann_lambda(state.step, ramp_steps)
  source_x, source_y = _as_arrays(source_batches)
  target_x = target_batch["x"] if isinstance(target_batch, dict) else target_batch
  _check(source_x, source_y, target_x)
  params = state.params
  # 1) Discriminator step on frozen features of the current featurizer (official update order).
  feats_s, _ = nets.features_and_logits(params["model"], source_x)
  feats_t, _ = nets.features_and_logits(params["model"], target_x)
  (_, d_metrics), d_grads = jax.value_and_grad(losses.discriminator_loss, has_aux=True)(
      params["disc"], nets, feats_s, feats_t)
  d_updates, d_opt = state.tx_disc.update(d_grads, state.opt_state["disc"], params["disc"])
  disc = optax.apply_updates(params["disc"], d_updates)
  # 2) Featurizer + classifier step against the updated, fixed discriminator.
  loss_fn = MODEL_LOSSES[method]
  (_, m_metrics), m_grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params["model"], disc, nets, source_x, source_y, target_x, adv_weight)
  m_updates, m_opt = state.tx_model.update(m_grads, state.opt_state["model"], params["model"])
  model = optax.apply_updates(params["model"], m_updates)
  new_state = state.replace(step=state.step + 1, params={"model": model, "disc": disc},
                            opt_state={"model": m_opt, "disc": d_opt})
  return new_state, {**m_metrics, **d_metrics}


def make_train_step(nets: Networks, method: str = "nci", adv_weight: float = 1.0,
                    dann_ramp_steps: int | None = None, ramp_steps: int | None = None) -> Callable:
  """Returns the pure `step(state, source_batches, target_batch, key) -> (state, metrics)` of a method.

  All three methods run exactly the same step (discriminator update, then featurizer/classifier
  update with the new discriminator); only the model loss differs. ERM's discriminator is trained too,
  as a probe of how separable the domains are, but never influences the model.

  Args:
    nets: the networks.
    method: 'nci', 'dann' or 'erm'.
    adv_weight: lambda of the adversarial term.
    dann_ramp_steps: for DANN only, scale lambda by Ganin et al.'s ramp over this many steps (the original
      DANN schedule; without it the K+1-way gradient reversal collapses the features early here).
    ramp_steps: scale lambda by the same ramp for every method (NCI and DANN on one schedule, so they differ
      only in the alignment term);
      overrides dann_ramp_steps.
  """
  if method not in MODEL_LOSSES:
    raise ValueError(f"unknown method '{method}'; choose one of {sorted(MODEL_LOSSES)}.")
  ramp = ramp_steps if ramp_steps is not None else (dann_ramp_steps if method == "dann" else None)

  def step(state: AdversarialState, source_batches: Any, target_batch: Any, key: jax.Array):
    return _step(state, source_batches, target_batch, key, nets=nets, method=method, adv_weight=adv_weight,
                 ramp_steps=ramp)

  step.__name__ = f"{method}_step"
  return step



def train_step(state: AdversarialState, source_batches: Any, target_batch: Any, key: jax.Array, *, nets: Networks,
               adv_weight: float = 1.0) -> tuple[AdversarialState, dict]:
  """One NCI step. source_batches: {'x': [K, B, H, W, C], 'y': [K, B]} or [(x, y)] * K; target [B_t, ...]."""
  return _step(state, source_batches, target_batch, key, nets=nets, method="nci", adv_weight=adv_weight)


def erm_step(state, source_batches, target_batch, key, *, nets: Networks, adv_weight: float = 1.0):
  """One ERM step (same structure, no adversarial term)."""
  return _step(state, source_batches, target_batch, key, nets=nets, method="erm", adv_weight=adv_weight)


def dann_step(state, source_batches, target_batch, key, *, nets: Networks, adv_weight: float = 1.0,
              ramp_steps: int | None = None):
  """One DANN step (same structure, gradient-reversal loss on sources and target)."""
  return _step(state, source_batches, target_batch, key, nets=nets, method="dann", adv_weight=adv_weight,
               ramp_steps=ramp_steps)


def evaluate(nets: Networks, params: Any, x: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> float:
  """Accuracy of the classifier on images x [N, H, W, C] with labels y [N]."""
  fwd = jax.jit(lambda p, xb: jnp.argmax(nets.features_and_logits(p, xb)[1], -1))
  correct = 0
  for s in range(0, len(x), batch_size):
    correct += int(jnp.sum(fwd(params["model"], x[s:s + batch_size]) == y[s:s + batch_size]))
  return correct / max(len(x), 1)


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


def study_domains(config: Any) -> list[data_lib.Domain]:
  """The domains the leave-one-out study runs on: all of each domain, or, when config.data.pool_fraction > 0
  (the 'pretrained' setting), what is left after `data.split_pool` took the pretraining pool out."""
  names = tuple(config.data.domains)
  domains = data_lib.make_domains(names, config.data.image_size, max_per_domain=config.data.get("max_per_domain"))
  frac = float(config.data.get("pool_fraction", 0.0) or 0.0)
  return data_lib.split_pool(domains, frac, seed=0)[1] if frac > 0 else domains


def pretraining_pool(config: Any) -> list[data_lib.Domain]:
  """The labelled pretraining pool (one Domain per style, all five styles; see `data.split_pool`)."""
  frac = float(config.data.get("pool_fraction", 0.0) or 0.0)
  if frac <= 0:
    raise ValueError("config.data.pool_fraction must be > 0 to pretrain (use the 'pretrained' variant).")
  names = tuple(config.data.domains)
  domains = data_lib.make_domains(names, config.data.image_size, max_per_domain=config.data.get("max_per_domain"))
  return data_lib.split_pool(domains, frac, seed=0)[0]


def head_name(params: Any) -> str:
  """The top-level name of the classifier's last Dense layer (the head h) in a classifier's params."""
  dense = [k for k in params if k.startswith("Dense_")]
  if not dense:
    raise ValueError(f"no Dense layer among the classifier params {sorted(params)}.")
  return max(dense, key=lambda k: int(k.split("_")[1]))


def pretrain(config: Any, seed: int = 0) -> tuple[Any, dict]:
  """ERM on the labelled pretraining pool (labels only, no domain terms) -> the classifier's params.

  The analogue of the paper's ImageNet checkpoint: one shared run (seed `seed`) that every arm and seed of the
  fine-tuning study starts from. Runs `make_train_fn` with method 'erm' and the five pool styles as its
  "sources" (a batch of config.pretrain.batch_size per style, the mean of the per-style CEs); the ERM model loss
  has no domain term (its discriminator is a probe that never reaches the model), and the "target" it is given
  (the pool itself) enters no model loss.

  Args:
    config: an nci config with data.pool_fraction > 0 and a `pretrain` block (steps, learning_rate, batch_size).
    seed: the key of the pretraining run.

  Returns:
    (params: the classifier's params {'Conv_0': ..., 'Dense_0': ...} (featurizer f and head h),
     info: dict(pool_size: int, pool_acc: float (training accuracy on the pool), steps: int)).
  """
  pool = pretraining_pool(config)
  px, py, pn = data_lib.stack_padded(pool)
  pc = config.pretrain
  nets = model_lib.make_networks(config.model, 10, len(pool))
  opt = ml_collections.ConfigDict(dict(config.optimizer))
  opt.learning_rate = float(pc.learning_rate)
  tx = make_optimizer(opt, int(pc.steps))
  train = make_train_fn(nets, "erm", 0.0, tx, tx, int(pc.steps), int(pc.batch_size), px.shape[2:])
  allx = np.concatenate([d.x for d in pool])
  params, _ = train(jax.random.key(seed)[None], jnp.asarray(px), jnp.asarray(py), jnp.asarray(pn), jnp.asarray(allx))
  params = jax.tree.map(lambda a: a[0], params["model"])
  acc = evaluate(nets, {"model": params}, allx, np.concatenate([d.y for d in pool]))
  return params, {"pool_size": int(len(allx)), "pool_acc": float(acc), "steps": int(pc.steps)}


def setup(config: Any, target: str, method: str):
  """The data, networks and optimizers of one (target, method) leave-one-domain-out run.

  Args:
    config: the nci config; target: the held-out domain (one of config.data.domains);
    method: 'erm' | 'dann' | 'nci' | 'oracle' ('oracle' adds the target's labelled adaptation split to the sources).

  Returns:
    (sources: list[Domain] (K), uda: Domain (target adaptation split, x [M, H, W, C]), evl: Domain (target
    evaluation split), nets: Networks, tx_model, tx_disc: optax optimizers).
  """
  names = tuple(config.data.domains)
  if target not in names:
    raise ValueError(f"target domain '{target}' is not among config.data.domains {names}.")
  domains = study_domains(config)
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
                  batch_size: int, input_shape: tuple[int, ...], ramp: int | None = None, init_params: Any = None,
                  fresh_head: bool = False):
  """Whole training runs of S seeds at once (a vmap over seeds) with on-device batch sampling.

  Args:
    nets, method, weight: the networks, 'erm' | 'dann' | 'nci' | 'oracle' and lambda.
    tx_model, tx_disc: optimizers; num_steps, batch_size: the budget; input_shape: (H, W, C).
    ramp: steps of the lambda ramp (see `ramp_steps`), None for a constant lambda.
    init_params: optional classifier params (e.g. from `pretrain`) every seed starts from instead of its random
      init (fine-tuning); the discriminator and both optimizer states are fresh per seed. With zero steps the
      returned model params equal `init_params` exactly.
    fresh_head: with init_params, keep each seed's random head (the last Dense layer) instead of the given one
      (DomainBed's fresh nn.Linear on a pretrained featurizer).

  Returns:
    train(keys [S], src_x [K, N, ...], src_y [K, N], src_n [K], tgt_x [M, ...]) -> (params [S, ...],
    metrics [S, T]). Seed s's init and batches depend on keys[s] only, so methods given the same keys
    are paired by seed.

  Deviation from the library's usual "whole run in one `lax.scan`": XLA:CPU runs conv backward passes
  40-80x slower inside a while loop than in a plain jitted call (measured with jax 0.9.2), so the
  steps are a Python loop over one jitted step that samples its own batch on device; with
  `scan=True` (accelerators) the same step runs under `lax.scan`.
  """
  step = make_train_step(nets, "erm" if method == "oracle" else method, weight, ramp_steps=ramp or 0)

  def sampled_step(state, i, key_data, src_x, src_y, src_n, tgt_x):
    k = src_x.shape[0]
    key_s, key_t = jax.random.split(jax.random.fold_in(key_data, i))
    idx = (jax.random.uniform(key_s, (k, batch_size)) * src_n[:, None]).astype(jnp.int32)
    rows = jnp.arange(k)[:, None]
    it = jax.random.randint(key_t, (batch_size,), 0, tgt_x.shape[0])
    state, m = step(state, {"x": src_x[rows, idx], "y": src_y[rows, idx]}, tgt_x[it], key_t)
    return state, {"loss": m["loss"], "nll": m["nll"], "d_acc": m["d_acc"]}

  seeds_step = jax.vmap(sampled_step, in_axes=(0, None, 0, None, None, None, None))
  def init_one(key):
    state = model_lib.init(key, nets, input_shape, tx_model, tx_disc)
    if init_params is None:
      return state
    model = jax.tree.map(jnp.asarray, dict(init_params))
    if fresh_head:
      head = head_name(model)
      model[head] = state.params["model"][head]
    return state.replace(params={"model": model, "disc": state.params["disc"]},
                         opt_state={"model": tx_model.init(model), "disc": state.opt_state["disc"]})

  init_fn = jax.jit(jax.vmap(init_one))
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
    if not ms:  # zero steps (e.g. the pretrained params as they are): no metrics
      return state.params, {}
    return state.params, jax.tree.map(lambda *xs: jnp.stack(xs, 1), *ms)

  return train


def leave_one_out(config: Any, target: str, method: str, seeds: int, weight: float | None = None,
                  vmap_seeds: bool | str = "auto", init_params: Any = None) -> dict:
  """Trains `seeds` runs of a method for one target domain -> accuracies per seed.

  Args:
    config: the nci config (adv_schedule picks the lambda schedule, see `ramp_steps`).
    target: the held-out domain; method: 'erm' | 'dann' | 'nci' | 'oracle'; seeds: S.
    weight: lambda (default `adv_weight(config, K)`).
    vmap_seeds: True runs the S seeds as one vmapped program; False one seed at a time (the same program
      with S = 1); 'auto' = vmap on GPU/TPU only: on XLA:CPU a vmap over seeds turns the convolutions into
      grouped ones, and 3 vmapped seeds cost 6x one seed (measured), twice the cost of running them in turn.
    init_params: classifier params to fine-tune from (`pretrain`), shared by every seed; config.fresh_head
      re-initialises the head per seed. None: each seed's random init (the from-scratch study).

  Returns:
    dict(target_acc [S], source_acc (mean), final_d_acc (mean)); seed s uses fold_in(key(config.seed), s)
    for every method, so methods are paired by seed (same init, same batches).
  """
  sources, uda, evl, nets, tx_m, tx_d = setup(config, target, method)
  sx, sy, sn = data_lib.stack_padded(sources)
  lam = adv_weight(config, len(sources)) if weight is None else float(weight)
  train = make_train_fn(nets, method, lam, tx_m, tx_d, config.num_steps, config.batch_size, sx.shape[2:],
                        ramp=ramp_steps(config, method), init_params=init_params,
                        fresh_head=bool(config.get("fresh_head", False)))
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
