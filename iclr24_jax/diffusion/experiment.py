"""The `diffusion` family check.

run(): trains a (class-conditional) UNet DDPM on scikit-learn digits (8x8, or upsampled to 16x16), samples it with
DDIM / DDPM (+ classifier-free guidance), writes sample grids, and asks a digits CNN (vision.classify) whether
the samples show the digits they were asked for.
reproduce(): sampler exactness with the analytic Gaussian-mixture denoiser (2-D and 8-D; DDPM and DDIM; a wrong
schedule as the negative control) and the digits model's recognisability.
benchmark(): UNet train step/s and sampler images/s at two image sizes on 1 and all devices.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import metrics as dm
from iclr24_jax.diffusion import samplers, schedules, training, unet

CHANCE = 0.1  # ten digit classes


# ----------------------------------------------------------------------------------------------- data


def digits_images(split: data_lib.Split, image_size: int) -> np.ndarray:
  """Digits [N, 8, 8, 1] in [0, 1] -> [N, S, S, 1] in [-1, 1] (bilinear upsampling when S > 8).

  Args:
    split: Split with x [N, h, h, 1] float32 in [0, 1] (h = 8 for digits).
    image_size: S, a multiple of h.

  Returns:
    float32 numpy [N, S, S, 1] in [-1, 1].

  Raises:
    ValueError: S is not a multiple of h.
  """
  x = np.asarray(split.x, np.float32)
  if image_size != x.shape[1]:
    if image_size % x.shape[1]:
      raise ValueError(f"data.image_size must be a multiple of the data's {x.shape[1]}-pixel images, got "
                       f"{image_size}.")
    x = np.asarray(jax.image.resize(x, (x.shape[0], image_size, image_size, 1), "linear"))
  return 2.0 * x - 1.0


def to_classifier_input(samples: np.ndarray, size: int = 8) -> np.ndarray:
  """Samples [N, S, S, 1] in [-1, 1] -> [N, size, size, 1] in [0, 1], the judging classifier's input.

  Args:
    samples: [N, S, S, 1] in [-1, 1].
    size: the classifier's input side (8 for scikit-learn digits, 28 for MNIST-5k); antialiased resize when S differs.

  Returns:
    float32 numpy [N, size, size, 1] in [0, 1].
  """
  x = np.clip((np.asarray(samples) + 1.0) / 2.0, 0.0, 1.0)
  if x.shape[1] != size:
    x = np.asarray(jax.image.resize(x, (x.shape[0], size, size, 1), "linear", antialias=True))
  return x


# ------------------------------------------------------------------------------------- classifier


def train_digits_classifier(cfg: Any, ds: data_lib.Dataset, progress: bool = False):
  """Trains the judging CNN on 8x8 digits; returns (model, state, test accuracy).

  Args:
    cfg: the config.classifier block: num_steps, batch_size, features, dense, learning_rate.
    ds: the Dataset (grey x [N, H, W, 1] in [0, 1], 10 classes: 8x8 digits here, 32x32 MNIST in mdm's judge);
      trained on one device.
    progress: print a progress line.

  Returns:
    (Linen CNN, TrainState, test accuracy float in [0, 1]).
  """
  from iclr24_jax.vision import classify
  ccfg = ml_collections.ConfigDict(dict(
      seed=0, num_steps=int(cfg.num_steps), batch_size=int(cfg.batch_size), log_every=max(int(cfg.num_steps), 1),
      eval_every=0, checkpoint_every=0,
      model=dict(name="cnn", features=tuple(cfg.features), dense=int(cfg.dense)),
      optimizer=dict(name="adam", learning_rate=float(cfg.learning_rate), schedule="cosine", warmup_steps=0)))
  # One device: the judge is small, and a 1-device compile is cheaper than an 8-way sharded one.
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  model, res = classify.train_classifier(ccfg, ds, mesh=mesh, progress=progress)
  acc = classify.evaluate(model, res.state, ds.test, mesh=mesh)["accuracy"]
  return model, res.state, acc


def judge_samples(model, state, samples: np.ndarray, labels: np.ndarray | None, logits: np.ndarray | None = None,
                  input_size: int = 8) -> dict[str, float]:
  """Classifier verdict on samples: accuracy vs the requested labels, mean confidence, class-histogram entropy.

  Args:
    model: the judging classifier.
    state: its TrainState.
    samples: [N, S, S, 1] in [-1, 1] (only used when logits is None).
    labels: [N] int requested digits, or None (unconditional: no accuracy).
    logits: precomputed [N, 10] judge logits, or None to compute them.
    input_size: the classifier's input side (see `to_classifier_input`).

  Returns:
    {'confidence': mean max-probability, 'class_entropy_bits': entropy of the predicted-class histogram
    (log2 10 = 3.32 for uniform), 'accuracy' (with labels)}.
  """
  from iclr24_jax.vision import classify
  if logits is None:
    logits = classify.predict(model, state, to_classifier_input(samples, input_size))
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
  pred = probs.argmax(-1)
  hist = np.bincount(pred, minlength=probs.shape[-1]) / len(pred)
  out = {"confidence": float(probs.max(-1).mean()),
         "class_entropy_bits": float(-(hist[hist > 0] * np.log2(hist[hist > 0])).sum())}
  if labels is not None:
    out["accuracy"] = float(np.mean(pred == labels))
  return out


# -------------------------------------------------------------------------------------------- run


def make_sample_fn(model, schedule, cfg: Any, num_classes: int):
  """A jitted (params, key, labels) -> samples function following config.sampler.

  Args:
    model: the UNet module.
    schedule: the noise schedule.
    cfg: the experiment config (sampler: method, num_steps, eta, clip_x0, guidance_scale; diffusion.prediction).
    num_classes: K > 0 for a class-conditional UNet (null class id K for guidance), 0 for unconditional.

  Returns:
    sample_fn(params, key, labels [N] int (ignored when unconditional), shape (static, e.g. (N, S, S, 1)))
    -> samples of `shape`.
  """
  s = cfg.sampler

  @functools.partial(jax.jit, static_argnums=(3,))
  def sample_fn(params, key, labels, shape):
    kw = dict(method=s.method, num_steps=int(s.num_steps), eta=float(s.eta), prediction=cfg.diffusion.prediction,
              clip_x0=(float(s.clip_x0) if s.get("clip_x0") else None))
    if num_classes:
      den = training.make_denoiser(model, params, cond_name="class_labels")
      if s.get("guidance_scale") is not None:
        return samplers.sample(den, schedule, shape, key, cond=labels,
                               null_cond=jnp.full_like(labels, num_classes), guidance_scale=float(s.guidance_scale),
                               **kw)
      return samplers.sample(den, schedule, shape, key, cond=labels, **kw)
    return samplers.sample(training.make_denoiser(model, params), schedule, shape, key, **kw)

  return sample_fn


def run(config: Any, workdir: str) -> dict:
  """Trains the digits DDPM, samples it, judges the samples; writes metrics.jsonl, results.json and PNGs.

  Args:
    config: the diffusion ConfigDict (`configs/diffusion.py`): data, model, schedule, diffusion, optimizer,
      sampler, classifier, num_steps, ...
    workdir: output folder (created; resumes from its checkpoints).

  Returns:
    results dict: num_steps, image_size, schedule, prediction, sampler, first_loss, final_loss, steps_per_s,
    resumed_from_step, classifier_test_accuracy, chance, samples_* and noise_* judge verdicts.

  Raises:
    ValueError: the data set is not grey 10-class digits.
  """
  os.makedirs(workdir, exist_ok=True)
  ds = data_lib.load_dataset(config.data.name, config.data.get("data_dir") or None)
  if ds.input_shape[-1] != 1 or ds.num_classes != 10:
    raise ValueError("the diffusion check expects grey digits with 10 classes (data.name='digits' or 'mnist5k').")
  size = int(config.data.image_size)
  x_train = digits_images(ds.train, size)
  num_classes = int(config.model.get("num_classes", 0))
  model = unet.create_model(config.model)
  schedule = schedules.from_config(config.schedule)
  tx = make_optimizer(config.optimizer, config.num_steps)
  d = config.diffusion
  ema = float(d.get("ema_decay", 0.0)) > 0
  example = {"class_labels": jnp.zeros((1,), jnp.int32)} if num_classes else {}
  init_fn = functools.partial(training.init, model=model, x_shape=x_train.shape[1:], tx=tx, ema=ema, **example)
  step = training.make_train_step(model, schedule, prediction=d.prediction, weighting=d.weighting,
                                  min_snr_gamma=float(d.min_snr_gamma), cond_drop_prob=float(d.cond_drop_prob),
                                  ema_decay=float(d.get("ema_decay", 0.0)))
  arrays = {"x": x_train, "y": ds.train.y} if num_classes else {"x": x_train}
  stream = data_lib.BatchStream(arrays, config.batch_size, seed=config.seed)
  mesh = sharding.make_mesh(config.get("mesh"))
  res = loop_lib.train_loop(init_fn=init_fn, train_step=step, batches=stream, num_steps=config.num_steps,
                            key=jax.random.key(config.seed), workdir=workdir, mesh=mesh,
                            log_every=config.log_every, config=config, name="diffusion",
                            **loop_lib.checkpoint_options(config))
  params = res.state.extra["ema_params"] if ema else res.state.params
  params = jax.device_put(params, jax.devices()[0])

  # Samples: labels 0..9 cycled (conditional) or none.
  n = int(config.sampler.num_samples)
  labels = np.arange(n) % 10
  sample_fn = make_sample_fn(model, schedule, config, num_classes)
  samples = np.asarray(sample_fn(params, jax.random.key(config.seed + 1), jnp.asarray(labels, jnp.int32),
                                 (n,) + x_train.shape[1:]))
  if not np.all(np.isfinite(samples)):
    raise FloatingPointError("the sampler produced NaN/inf; lower the learning rate or check the schedule.")

  clf_model, clf_state, clf_acc = train_digits_classifier(config.classifier, ds)
  # Samples and a uniform-noise baseline, classified in one call.
  noise = np.random.default_rng(0).uniform(-1, 1, samples.shape).astype(np.float32)
  from iclr24_jax.vision import classify
  logits = classify.predict(clf_model, clf_state,
                            to_classifier_input(np.concatenate([samples, noise]), ds.train.x.shape[1]))
  verdict = judge_samples(clf_model, clf_state, samples, labels if num_classes else None, logits[:n])
  noise_verdict = judge_samples(clf_model, clf_state, noise, None, logits[n:])

  losses = [r["train/loss"] for r in res.history if "train/loss" in r]
  results = {"num_steps": config.num_steps, "image_size": size, "schedule": schedule.name,
             "prediction": d.prediction, "sampler": dict(config.sampler),
             "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
             "steps_per_s": res.steps_per_s, "resumed_from_step": res.start_step,
             "classifier_test_accuracy": clf_acc, "chance": CHANCE,
             **{f"samples_{k}": v for k, v in verdict.items()},
             **{f"noise_{k}": v for k, v in noise_verdict.items()}}
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0:
    order = np.argsort(labels, kind="stable")[:100] if num_classes else np.arange(min(n, 100))
    grid = (samples[order] + 1.0) / 2.0
    metrics_lib.plot_image_grid(grid, os.path.join(workdir, "samples.png"), ncols=10,
                                title=f"{config.sampler.method} samples ({size}x{size})"
                                + (", rows = requested digit" if num_classes else ""))
    metrics_lib.plot_image_grid((x_train[:len(order)] + 1.0) / 2.0, os.path.join(workdir, "data.png"), ncols=10,
                                title=f"training digits ({size}x{size})")
    rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    metrics_lib.plot_curves(rows, ["train/loss"], os.path.join(workdir, "loss.png"), title="denoising loss")
  return results


# --------------------------------------------------------------------------------- GMM exactness


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
  x = samplers.sample(den, sampler_schedule or schedule, (n, gmm.dim), key_s, method=method, num_steps=num_steps,
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
    x = np.asarray(samplers.sample(gmm_lib.gmm_denoiser(g, sched), wrong or sched, (2000, 2), jax.random.key(1), **kw))
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


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  """GMM exactness of DDPM / DDIM (with a wrong-schedule control) and the digits model's recognisability.

  Args:
    workdir: output folder (created).
    fast: fewer GMM samples and the 'tiny' digits config.

  Returns:
    list of reproduction row dicts.
  """
  from iclr24_jax.configs import diffusion as cfg_mod
  os.makedirs(workdir, exist_ok=True)
  rows = _gmm_rows(workdir, fast)
  cfg = cfg_mod.get_config("tiny" if fast else "")
  run_dir = os.path.join(workdir, "digits")
  res = run(cfg, run_dir)
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


# -------------------------------------------------------------------------------------- benchmark


def benchmark(quick: bool = True) -> list[dict]:
  """UNet train step/s and DDIM sampler images/s at two image sizes, on 1 and all devices."""
  from iclr24_jax.configs import diffusion as cfg_mod
  cfg = cfg_mod.get_config("")
  model = unet.create_model({**cfg.model.to_dict(), "num_classes": 0})
  schedule = schedules.from_config(cfg.schedule)
  tx = make_optimizer(cfg.optimizer, 1000)
  step = training.make_train_step(model, schedule)
  batch_size, sample_steps = 64, 10
  sizes = (8, 16) if quick else (16, 32)

  def init(mesh, size):
    return jax.jit(lambda k: training.init(k, model, (size, size, 1), tx),
                   out_shardings=sharding.replicated_sharding(mesh))(jax.random.key(0))

  def train_case(mesh, size):
    batch = np.random.default_rng(0).standard_normal((batch_size, size, size, 1)).astype(np.float32)
    return (loop_lib.compile_step(step, mesh), (init(mesh, size), sharding.shard_batch({"x": batch}, mesh),
                                                jax.random.key(1)),
            dict(items=batch_size, name="diffusion/unet_train_step", size=f"{size}x{size}", batch=batch_size))

  def sample_images(params, x_T, key):
    den = training.make_denoiser(model, params)
    return samplers.sample(den, schedule, x_T.shape, key, method="ddim", num_steps=sample_steps, x_T=x_T)

  def sample_case(mesh, size):
    rep, dat = sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)
    x_T = np.random.default_rng(1).standard_normal((batch_size, size, size, 1)).astype(np.float32)
    return (jax.jit(sample_images, in_shardings=(rep, dat, rep), out_shardings=dat),
            (init(mesh, size).params, sharding.shard_batch(x_T, mesh), jax.random.key(2)),
            dict(items=batch_size, name=f"diffusion/ddim_{sample_steps}_steps_sample", size=f"{size}x{size}",
                 batch=batch_size))

  return (bench.across_devices(train_case, sizes=sizes, carry=True, repeats=3 if quick else 10)
          + bench.across_devices(sample_case, sizes=sizes, repeats=2 if quick else 5))
