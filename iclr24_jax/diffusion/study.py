"""The `diffusion` family check's studies (`experiment.run` trains and samples the digits model).

reproduce(): sampler exactness with the analytic Gaussian-mixture denoiser (2-D and 8-D; DDPM and DDIM; a wrong
schedule as the negative control) and the digits model's recognisability (`judge_run`: a digits CNN from
`vision.judge` asked whether the samples show the digits they were asked for).
benchmark(): UNet train step/s and sampler images/s at two image sizes on 1 and all devices.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import jax
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import metrics as dm
from iclr24_jax.diffusion import samplers, schedules, train, unet
from iclr24_jax.diffusion.experiment import run
from iclr24_jax.vision import classify, judge

CHANCE = 0.1  # ten digit classes


def judge_run(run_dir: str, config: Any) -> dict[str, float]:
  """Asks a digits CNN whether a finished run's samples show the digits they were asked for.

  The CNN (config.classifier) is trained on the run's data set; the samples and a uniform-noise baseline of the
  same shape are classified in one call.

  Args:
    run_dir: the workdir of a finished `experiment.run` (its samples.npz).
    config: that run's diffusion ConfigDict (data, classifier).

  Returns:
    {'classifier_test_accuracy', 'chance', 'samples_confidence', 'samples_class_entropy_bits',
    'samples_accuracy' (conditional runs), 'noise_confidence', 'noise_class_entropy_bits'}.
  """
  ds = data_lib.load_dataset(config.data.name, config.data.get("data_dir") or None)
  with np.load(os.path.join(run_dir, "samples.npz")) as f:
    samples, labels = f["samples"], f["labels"]
  model, state, acc = judge.train_digits_classifier(config.classifier, ds)
  noise = np.random.default_rng(0).uniform(-1, 1, samples.shape).astype(np.float32)
  n, size = len(samples), ds.train.x.shape[1]
  logits = classify.predict(model, state, judge.to_classifier_input(np.concatenate([samples, noise]), size))
  verdict = judge.judge_samples(model, state, samples, labels if labels[0] >= 0 else None, logits[:n])
  noise_verdict = judge.judge_samples(model, state, noise, None, logits[n:])
  return {"classifier_test_accuracy": acc, "chance": CHANCE, **{f"samples_{k}": v for k, v in verdict.items()},
          **{f"noise_{k}": v for k, v in noise_verdict.items()}}


def gmm_exactness(gmm: gmm_lib.GaussianMixture, schedule, n: int, key: jax.Array, *, method: str,
                  num_steps: int | None = None, eta: float = 0.0, sampler_schedule=None,
                  num_refs: int = 4) -> dict[str, float]:
  """Samples with the exact GMM denoiser and compares with data draws.

  Args:
    gmm: the data distribution.
    schedule: the schedule the denoiser is exact for.
    n: samples (= size of each data draw).
    key: randomness (data draws, sampler, projections).
    method, num_steps, eta: the sampler.
    sampler_schedule: the schedule the sampler uses (default `schedule`; another one is a deliberate error).
    num_refs: independent data draws averaged over (`metrics.sliced_wasserstein_vs_data`).

  Returns:
    sw (sampler vs data draws), sw_floor (data vs data draws), sw_ratio, mean_err, cov_err, weight_err.
  """
  key_s, key_sw = jax.random.split(key)
  den = gmm_lib.gmm_denoiser(gmm, schedule)
  x = samplers.sample(key_s, den, sampler_schedule or schedule, (n, gmm.dim), method=method, num_steps=num_steps,
                      eta=eta)
  sw, floor = dm.sliced_wasserstein_vs_data(x, lambda k, m: gmm.sample(k, m), key_sw, num_refs=num_refs)
  errs = dm.moment_errors(gmm, x)
  out = {"sw": sw, "sw_floor": floor, "sw_ratio": sw / floor, **errs}
  return {k: float(v) for k, v in jax.device_get(out).items()}


def _gmm_rows(workdir: str, fast: bool) -> list[dict]:
  n = 2048 if fast else 8192
  ring = gmm_lib.ring_gmm()
  gmm8 = gmm_lib.make_gmm(jax.random.key(8), 8, 4)
  lin = schedules.linear_beta_schedule()
  cos = schedules.cosine_beta_schedule()
  bound = 2.5
  cases = [
      ("2-D ring, DDPM 1000 steps", ring, lin, dict(method="ddpm"), None),
      ("2-D ring, DDIM(eta=0) 100 steps", ring, lin, dict(method="ddim", num_steps=100), None),
      ("2-D ring, DDIM(eta=0) 100 steps, cosine", ring, cos, dict(method="ddim", num_steps=100), None),
      ("2-D ring, DDPM with a wrong schedule (denoiser: linear, sampler: cosine)", ring, lin, dict(method="ddpm"),
       cos),
      ("8-D GMM, DDPM 1000 steps", gmm8, lin, dict(method="ddpm"), None),
      ("8-D GMM, DDIM(eta=0) 100 steps", gmm8, lin, dict(method="ddim", num_steps=100), None),
  ]
  if fast:  # the 2-D samplers and the negative control only
    cases = [c for c in cases if c[0].startswith("2-D") and not c[0].endswith(", cosine")]
  rows, plots_data = [], {}
  for i, (name, g, sched, kw, wrong) in enumerate(cases):
    r = gmm_exactness(g, sched, n, jax.random.key(100 + i), sampler_schedule=wrong, **kw)
    expect_pass = wrong is None
    holds = (r["sw_ratio"] < bound) if expect_pass else (r["sw_ratio"] > bound)
    rows.append({"paper": "diffusion", "experiment": f"{name} (n={n})", "metric": "sliced W2 / data-vs-data floor",
                 "ours": r["sw_ratio"],
                 "paper_value": ("exact score => samples follow the data (DDPM Sec. 3; DDIM Eq. 12); "
                                 f"ratio < {bound}") if expect_pass else f"a wrong schedule must fail: ratio > {bound}",
                 "holds": bool(holds) if not fast else None, "kind": "check",
                 "notes": (f"sw={r['sw']:.4f} floor={r['sw_floor']:.4f} max|mean err|={r['mean_err']:.3f} "
                           f"max|cov err|={r['cov_err']:.3f} max|weight err|={r['weight_err']:.4f}"),
                 "plots": []})
    if g is ring:
      plots_data[name] = (g, sched, kw, wrong)
  path = os.path.join(workdir, "gmm_samples.png")
  fig, axes = metrics_lib.new_figure(ncols=len(plots_data) + 1, size=(3.2, 3.2))
  data = np.asarray(ring.sample(jax.random.key(0), 2000))
  axes[0, 0].scatter(data[:, 0], data[:, 1], s=1)
  axes[0, 0].set_title("data", fontsize=8)
  for ax, (name, (g, sched, kw, wrong)) in zip(axes[0, 1:], plots_data.items()):
    x = np.asarray(samplers.sample(jax.random.key(1), gmm_lib.gmm_denoiser(g, sched), wrong or sched, (2000, 2), **kw))
    ax.scatter(x[:, 0], x[:, 1], s=1)
    ax.set_title(name.replace("2-D ring, ", "").replace(" (", "\n("), fontsize=7)
  for ax in axes[0]:
    ax.set_xlim(-5, 5)
    ax.set_ylim(-5, 5)
    ax.set_aspect("equal")
  metrics_lib.save_figure(fig, path)
  for r in rows:
    if r["experiment"].startswith("2-D"):
      r["plots"] = [path]
  return rows


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """GMM exactness of DDPM / DDIM (with a wrong-schedule control) and the digits model's recognisability.

  Args:
    workdir: output folder (created).
    fast: fewer GMM samples and the 'tiny' digits config.
    get_config: `get_config(variant)` of configs/diffusion.py (the runners pass it; tests pass the module's).

  Returns:
    list of reproduction row dicts.
  """
  os.makedirs(workdir, exist_ok=True)
  rows = _gmm_rows(workdir, fast)
  cfg = get_config("tiny" if fast else "")
  run_dir = os.path.join(workdir, "digits")
  res = {**run(cfg, run_dir), **judge_run(run_dir, cfg)}
  acc = res["samples_accuracy"]
  # "Above chance" at 3 binomial standard errors: 0.1 + 3 sqrt(0.1 * 0.9 / n).
  threshold = CHANCE + 3.0 * np.sqrt(CHANCE * (1 - CHANCE) / cfg.sampler.num_samples)
  s = cfg.sampler
  rows.append({"paper": "diffusion",
               "experiment": (f"digits {res['image_size']}x{res['image_size']} class-cond. UNet, {cfg.num_steps} steps, "
                              f"{s.method} {s.num_steps} steps, CFG w={s.guidance_scale}"),
               "metric": "digits-CNN accuracy on samples (requested label)", "ours": acc,
               "paper_value": (f"above chance ({CHANCE}; > {threshold:.3f} at 3 SE); the CNN scores "
                               f"{res['classifier_test_accuracy']:.3f} on real test digits"),
               "holds": bool(acc > threshold) if not fast else None, "kind": "check",
               "notes": (f"loss {res['first_loss']:.3f} -> {res['final_loss']:.3f}; sample confidence "
                         f"{res['samples_confidence']:.2f} vs uniform noise {res['noise_confidence']:.2f}"),
               "plots": [os.path.join(run_dir, "samples.png"), os.path.join(run_dir, "loss.png")]})
  return rows


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """UNet train step/s and DDIM sampler images/s at two image sizes, on 1 and all devices."""
  cfg = get_config("")
  model = unet.create_model({**cfg.model.to_dict(), "num_classes": 0})
  schedule = schedules.from_config(cfg.schedule)
  tx = make_optimizer(cfg.optimizer, 1000)
  step = train.make_train_step(model, schedule)
  batch_size, sample_steps = 64, 10
  sizes = (8, 16) if quick else (16, 32)

  def init(mesh, size):
    return jax.jit(lambda k: train.init(k, model, (size, size, 1), tx),
                   out_shardings=sharding.replicated_sharding(mesh))(jax.random.key(0))

  def train_case(mesh, size):
    batch = np.random.default_rng(0).standard_normal((batch_size, size, size, 1)).astype(np.float32)
    return (loop_lib.compile_step(step, mesh), (init(mesh, size), sharding.shard_batch({"x": batch}, mesh),
                                                jax.random.key(1)),
            dict(items=batch_size, name="diffusion/unet_train_step", size=f"{size}x{size}", batch=batch_size))

  def sample_images(params, x_T, key):
    den = train.make_denoiser(model, params)
    return samplers.sample(key, den, schedule, x_T.shape, method="ddim", num_steps=sample_steps, x_T=x_T)

  def sample_case(mesh, size):
    rep, dat = sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)
    x_T = np.random.default_rng(1).standard_normal((batch_size, size, size, 1)).astype(np.float32)
    return (jax.jit(sample_images, in_shardings=(rep, dat, rep), out_shardings=dat),
            (init(mesh, size).params, sharding.shard_batch(x_T, mesh), jax.random.key(2)),
            dict(items=batch_size, name=f"diffusion/ddim_{sample_steps}_steps_sample", size=f"{size}x{size}",
                 batch=batch_size))

  return (bench.across_devices(train_case, sizes=sizes, carry=True, repeats=3 if quick else 10)
          + bench.across_devices(sample_case, sizes=sizes, repeats=2 if quick else 5))
