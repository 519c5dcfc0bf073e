"""coboosting: the small-scale reproduction (`reproduce`) and the benchmark (`benchmark`).

The method lives in the package's method modules and `experiment.run`; this module holds the studies
that the paper's claims are checked with (experiments/reproduce.py and experiments/benchmark.py call them).
"""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common import stats
from iclr24_jax.papers.coboosting import coboost
from iclr24_jax.papers.coboosting import model as model_lib
from iclr24_jax.vision.models import create_model
from iclr24_jax.papers.coboosting.experiment import LABELS, make_method, resolve_vmap, run


PAPER_CLAIM = ("Co-Boosting substantially above DENSE and FedAvg at every Dirichlet level (paper's main table; "
               "MNIST/FMNIST/SVHN/CIFAR)")
# The paper sentences the claim rows test.
BASIS = ("'Co-Boosting can substantially outperform existing baselines under various settings' (abstract; the main "
         "results table)")
BASIS_ENSEMBLE = ("'These hard samples are then employed to promote the quality of the ensemble model by adjusting the "
                  "ensembling weights for each client model' (abstract)")

# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper="coboosting", experiment="digits, 10 clients with heterogeneous architectures: Co-Boosting vs DENSE-like",
        metric="server test accuracy",
        basis="'allows client models to have heterogeneous architectures' (abstract)",
        reason="every reproduction row uses one client architecture",
        variant="configs/coboosting.py:reproduce,hetero over the reproduction's seeds, judged like the rows above"),
]
METRICS = ("coboosting", "dense", "coboosting_best", "dense_best", "fedavg", "ensemble", "cb_weighted_ensemble")


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  """Co-Boosting vs the DENSE-like baseline (paired: same clients, same server and generator keys) and FedAvg at
  Dirichlet 0.1 and 0.3, 6 seeds; final and best-epoch server accuracy; the uniform ensemble is the teacher.

  Budget (2 CPU cores): the 'reproduce' config (digits, 10 CNN clients, 30 server epochs of 20 generator
  steps, evaluated every epoch); fast=True runs alpha 0.1 with one seed and 3 epochs.
  """
  from iclr24_jax.configs import coboosting as cfg_mod
  alphas = (0.1,) if fast else (0.1, 0.3)
  seeds = (0,) if fast else tuple(range(6))
  t0 = time.perf_counter()
  table: dict[float, dict[str, list]] = {}
  for alpha in alphas:
    table[alpha] = {m: [] for m in METRICS}
    for seed in seeds:
      cfg = cfg_mod.get_config(f"reproduce,alpha={alpha}")
      cfg.seed = seed
      cfg.plots = seed == seeds[0]
      cfg.progress = False
      if fast:
        cfg.num_epochs = 3
        cfg.coboost.g_steps = 5
        cfg.client.local_epochs = 10
        cfg.eval_every = 1
      res = run(cfg, os.path.join(workdir, f"alpha{alpha}_seed{seed}"))
      for m in ("coboosting", "dense", "fedavg", "ensemble"):
        table[alpha][m].append(res[f"{m}/test_accuracy"])
      for m in ("coboosting", "dense"):
        table[alpha][f"{m}_best"].append(res[f"{m}/best_test_accuracy"])
      table[alpha]["cb_weighted_ensemble"].append(res["coboosting/weighted_ensemble_accuracy"])
  elapsed = time.perf_counter() - t0
  plot = _reproduce_plot(workdir, table)
  rows = []
  setting = (f"digits, 10 clients, {'3' if fast else '30'} server epochs, {len(seeds)} seeds paired "
             "(same clients and keys)")
  for alpha, accs in table.items():
    exp = f"digits, 10 clients, Dirichlet alpha={alpha}"
    teacher = stats.mean_se(accs["ensemble"])
    common = (f"{setting}; teacher (uniform ensemble) {teacher[0]:.3f}+-{teacher[1]:.3f}; total {elapsed:.0f}s")
    rows.append(stats.compare_row(
        paper="coboosting", experiment=f"{exp}: Co-Boosting vs DENSE-like (final epoch)", metric="server test accuracy",
        a=accs["coboosting"], b=accs["dense"], name_a="Co-Boosting", name_b="DENSE-like", paper_value=PAPER_CLAIM,
        kind="claim", basis=BASIS, notes=common,
        plots=[plot, os.path.join(workdir, f"alpha{alpha}_seed{seeds[0]}", "curves.png")]))
    rows.append(stats.compare_row(
        paper="coboosting", experiment=f"{exp}: Co-Boosting vs DENSE-like (best epoch, as the official code reports)",
        metric="best server test accuracy over epochs", a=accs["coboosting_best"], b=accs["dense_best"],
        name_a="Co-Boosting", name_b="DENSE-like", paper_value=PAPER_CLAIM, kind="claim", basis=BASIS,
        notes=f"{setting}; best of the 30 per-epoch evaluations on the test set (optimistic, as in the paper)"))
    rows.append(stats.compare_row(
        paper="coboosting", experiment=f"{exp}: Co-Boosting vs FedAvg (one round)", metric="server test accuracy",
        a=accs["coboosting"], b=accs["fedavg"], name_a="Co-Boosting", name_b="FedAvg", paper_value=PAPER_CLAIM,
        kind="claim", basis=BASIS, notes=setting))
    rows.append(stats.compare_row(
        paper="coboosting", experiment=f"{exp}: Co-Boosting's re-weighted ensemble vs the uniform one",
        metric="ensemble test accuracy", a=accs["cb_weighted_ensemble"], b=accs["ensemble"],
        name_a="re-weighted", name_b="uniform", paper_value="boosting the ensemble weights improves the teacher",
        kind="claim", basis=BASIS_ENSEMBLE, notes=setting))
    rows.append({"paper": "coboosting", "experiment": f"{exp}: uniform ensemble of the clients (the teacher)",
                 "metric": "test accuracy", "ours": f"{teacher[0]:.3f}+-{teacher[1]:.3f} ({len(seeds)} seeds)",
                 "paper_value": "the distillation teacher (an upper reference, not a competitor)", "holds": None,
                 "kind": "measurement",
                 "notes": "every distilled server learns from this ensemble (Co-Boosting: re-weighted)"})
    if fast:
      for r in rows:
        r["holds"] = None
  return rows


def _reproduce_plot(workdir: str, table: dict) -> str:
  fig, axes = metrics_lib.new_figure(size=(6.0, 3.2))
  ax = axes[0, 0]
  methods = ("coboosting", "dense", "fedavg", "ensemble")
  alphas = list(table)
  width = 0.2
  for i, m in enumerate(methods):
    means = [np.mean(table[a][m]) for a in alphas]
    ses = [stats.mean_se(table[a][m])[1] for a in alphas]
    label = LABELS[m] + (" (teacher)" if m == "ensemble" else "")
    ax.bar(np.arange(len(alphas)) + (i - 1.5) * width, means, width, yerr=ses, label=label, capsize=2)
  ax.set_xticks(np.arange(len(alphas)))
  ax.set_xticklabels([f"alpha={a}" for a in alphas])
  ax.set_ylabel("server test accuracy")
  ax.set_title("one-shot FL on digits (10 clients), mean +- SE over seeds")
  ax.legend(fontsize=7)
  return metrics_lib.save_figure(fig, os.path.join(workdir, "reproduction.png"))


def _bench_setup(num_clients: int, vmap: bool, image_size: int = 8, quick: bool = True):
  from iclr24_jax.configs import coboosting as cfg_mod
  cfg = cfg_mod.get_config("reproduce")
  if quick:
    small = dict(name="cnn", features=(8, 16), dense=32)
    cfg.client.models = (small,)
    cfg.model = ml_collections.ConfigDict(small)
    cfg.generator.ngf = 8
  models = model_lib.client_models(list(cfg.client.models), num_clients, 10)
  shape = (image_size, image_size, 1)
  params = model_lib.stack_params([models[0].init(jax.random.key(i), jnp.zeros((1,) + shape))["params"]
                                   for i in range(num_clients)])
  clients = model_lib.ClientSet((models[0],), num_clients, True, vmap)
  method = make_method(cfg, clients, create_model(cfg.model, 10), shape, 10)
  return cfg, method, params, shape


def benchmark(quick: bool = True) -> list[dict]:
  """Epoch time (g_steps synthesis + re-weighting + distillation over a fixed pool) vs number of clients.

  Rows: one epoch for 5, 10 and 20 clients on 1 device; the synthesis and distillation steps (C = 10) on 1 and
  all devices; with quick=False also the other client evaluation (vmap vs unrolled) and larger sizes.
  """
  rows = []
  batch = 64
  g_steps = 5 if quick else 20
  pool_batches = 4 if quick else 16
  mesh1 = sharding.make_mesh(devices=jax.devices()[:1])
  default_vmap = resolve_vmap("auto")
  for c in (5, 10, 20):
    cfg, method, params, shape = _bench_setup(c, vmap=default_vmap, quick=quick)
    comp = coboost.compiled(method, mesh1, batch, shape)
    weights = jnp.full((c,), 1.0 / c, jnp.float32)  # not weak-typed: a weak input would compile a 2nd time
    state = {"teacher": sharding.replicate({"clients": params, "weights": weights}, mesh1),
             "server": comp.init(jax.random.key(0))}
    knob = sharding.replicate(coboost.knobs(method), mesh1)
    rng = np.random.default_rng(0)
    pool_x = rng.random((pool_batches * batch,) + shape, dtype=np.float32)
    pool_y = rng.integers(0, 10, pool_batches * batch).astype(np.int32)
    step_size, lr = jnp.float32(0.01), jnp.float32(0.05)

    def epoch(comp=comp, knob=knob, state=state, pool_x=pool_x, pool_y=pool_y, step_size=step_size, lr=lr):
      synth = comp.init_synth(jax.random.key(1))
      for _ in range(g_steps):
        synth, _ = comp.synth_step(synth, state["teacher"], state["server"].params, state["server"].extra, knob)
      for b in range(pool_batches):
        sl = slice(b * batch, (b + 1) * batch)
        state["teacher"], _ = comp.weight_step(state["teacher"], {"x": pool_x[sl], "y": pool_y[sl]}, step_size)
      for b in range(pool_batches):
        sl = slice(b * batch, (b + 1) * batch)
        state["server"], _ = comp.distill_step(state["server"], state["teacher"], {"x": pool_x[sl]},
                                               jax.random.key(2), lr, knob)
      return state["server"].params, synth.best_x

    rows.append(bench.time_host(epoch, repeats=2 if quick else 5, items=batch * (g_steps + 2 * pool_batches),
                                name=f"coboosting/epoch(g_steps={g_steps}, pool={pool_batches}x{batch})",
                                size=c, batch=batch, mesh_devices=1, clients=c,
                                client_eval="vmap" if default_vmap else "unrolled"))
  # Single steps (C = 10) on 1 and all devices; quick=False adds the other client evaluation on 1 device.
  for vmap in ((default_vmap,) if quick else (default_vmap, not default_vmap)):
    cfg, method, params, shape = _bench_setup(10, vmap=vmap, quick=quick)
    counts = None if vmap == default_vmap else (1,)
    tag = dict(size=10, batch=batch, clients=10, client_eval="vmap" if vmap else "unrolled")

    def parts(mesh, method=method, params=params, shape=shape):
      comp = coboost.compiled(method, mesh, batch, shape)
      teacher = sharding.replicate({"clients": params, "weights": jnp.full((10,), 0.1, jnp.float32)}, mesh)
      knob = sharding.replicate(coboost.knobs(method), mesh)
      return comp, teacher, knob, comp.init(jax.random.key(0))

    def synth_case(mesh, _):
      comp, teacher, knob, server = parts(mesh)
      return comp.synth_step, (comp.init_synth(jax.random.key(1)), teacher, server.params, server.extra, knob), dict(
          items=batch, name="coboosting/synthesis_step", **tag)

    def distill_case(mesh, _, shape=shape):
      comp, teacher, knob, server = parts(mesh)
      xb = sharding.shard_batch({"x": np.zeros((batch,) + shape, np.float32)}, mesh)
      return comp.distill_step, (server, teacher, xb, jax.random.key(2), jnp.float32(0.05), knob), dict(
          items=batch, name="coboosting/distill_step", **tag)

    for case in (synth_case, distill_case):
      rows += bench.across_devices(case, counts=counts, carry=True, repeats=5 if quick else 20)
  return rows
