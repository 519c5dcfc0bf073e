"""MDM experiments: run (one arm), reproduce (three arms at equal compute, 3 seeds), benchmark.

run(config, workdir): trains one arm on MNIST-5k 32 -> 8 (or the tiny digits check) with `common.loop`:
  'progressive' (the low-resolution UNet first, loaded as the inner network, then the NestedUNet), 'nested'
  (from scratch) or 'single' (one UNet at 32x32); samples every level jointly with guidance, writes
  samples.png, metrics.jsonl and results.json (held-out eps-MSE per level, a CNN's accuracy on the samples).
reproduce(workdir, fast): the paper's "nested + progressive converges faster than a single-resolution model"
  at equal training compute (XLA FLOPs of each arm's train step; the progressive arm's inner pre-training counts),
  3 seeds vmapped into one program per arm, 3 checkpoints; held-out 32x32 eps-MSE, the MNIST CNN's accuracy on
  samples of the requested digit, sliced W2 of its features against the data-vs-data floor, and the cross-level
  consistency of joint samples; claims judged with `common.stats`.
benchmark(quick): train step/s of the NestedUNet vs the single-resolution UNet, 1 and all devices.
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding, stats
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.diffusion import metrics as dmetrics
from iclr24_jax.diffusion import schedules as schedules_lib
from iclr24_jax.papers.mdm import model as model_lib
from iclr24_jax.papers.mdm import training

PAPER = "mdm"
ARMS = ("progressive", "nested", "single")
ARM_NAMES = {"progressive": "nested+progressive", "nested": "nested (scratch)", "single": "single-res 32x32"}


def _get_config(arg: str):
  from iclr24_jax.configs import mdm as cfg_mod
  return cfg_mod.get_config(arg)


# ----------------------------------------------------------------------------------------------- data


def load_images(data_cfg: Any) -> tuple[data_lib.Dataset, dict[str, np.ndarray]]:
  """The data set and its images in [-1, 1] at `data_cfg.image_size`.

  mnist5k: 28x28 zero-padded (2 pixels a side) to 32x32. digits (tiny only): 8x8 bilinearly upsampled.

  Returns:
    (dataset, dict x_train [N, S, S, 1], y_train [N], x_eval [M, S, S, 1], y_eval [M]) with eval = val + test.
  """
  ds = data_lib.load_dataset(data_cfg.name, data_cfg.get("data_dir") or None)
  size = int(data_cfg.image_size)
  if ds.input_shape[-1] != 1 or ds.num_classes != 10:
    raise ValueError("mdm expects grey digits with 10 classes (data.name='mnist5k' or 'digits').")

  def prep(x):
    x = np.asarray(x, np.float32)
    h = x.shape[1]
    if size == h + 4:                                  # MNIST 28 -> 32
      x = np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)))
    elif size % h == 0 and size != h:                  # digits 8 -> 16
      x = np.asarray(jax.image.resize(x, (x.shape[0], size, size, 1), "linear"))
    elif size != h:
      raise ValueError(f"data.image_size={size} does not fit {ds.name} images of size {h} (use {h + 4} or a "
                       f"multiple of {h}).")
    return 2.0 * x - 1.0

  out = {"x_train": prep(ds.train.x), "y_train": np.asarray(ds.train.y, np.int32),
         "x_eval": prep(np.concatenate([ds.val.x, ds.test.x])),
         "y_eval": np.concatenate([ds.val.y, ds.test.y]).astype(np.int32)}
  return ds, out


# --------------------------------------------------------------------------------------------- models


def build(config: Any) -> dict[str, Any]:
  """The three networks and their schedules from a config.

  Returns:
    dict nested (NestedUNet), inner (its standalone inner network), single (UNet at the high resolution),
    schedules {arm model name: tuple of level schedules}, image_shape, factor.
  """
  m = config.model
  nested = model_lib.make_model([dict(c) for c in m.levels], num_classes=int(m.num_classes),
                                skip_inner_input=bool(m.skip_inner_input))
  inner = model_lib.inner_model(nested)
  single = model_lib.make_model([dict(m.single)], num_classes=int(m.num_classes))
  d = config.diffusion
  base = schedules_lib.make_schedule(d.schedule, int(d.num_timesteps))
  levels = model_lib.num_levels(nested)
  factors = training.level_factors(nested)
  if len(set(factors)) != 1:
    raise ValueError(f"the reproduction expects one factor between levels, got {factors}.")
  scheds = model_lib.level_schedules(base, levels, factors[0], float(d.power))
  size = int(config.data.image_size)
  return {"nested": nested, "inner": inner, "single": single, "image_shape": (size, size, 1), "factor": factors[0],
          "schedules": {"nested": scheds, "inner": scheds[1:], "single": scheds[:1]}}


def loss_kwargs(config: Any) -> dict[str, Any]:
  d = config.diffusion
  return dict(prediction=d.prediction, loss_target=d.loss_target,
              level_weights=None if d.level_weights is None else tuple(d.level_weights),
              mixed_ratio=None if d.mixed_ratio is None else tuple(d.mixed_ratio),
              cond_drop_prob=float(d.cond_drop_prob))


def _inner_kwargs(config: Any) -> dict[str, Any]:
  kw = loss_kwargs(config)
  for k in ("level_weights", "mixed_ratio"):
    if kw[k] is not None:
      kw[k] = kw[k][1:]
  return kw


# ------------------------------------------------------------------------------------------------ run


def _train(config, workdir, model, scheds, image_shape, arrays, num_steps, loss_kw, init_params=None, name="train"):
  tx = make_optimizer(config.optimizer, num_steps)

  def init_fn(key):
    p = training.init_params(key, model, image_shape)
    if init_params is not None:
      p = model_lib.load_inner(p, init_params)
    return TrainState.create(p, tx)

  stream = data_lib.BatchStream(arrays, config.batch_size, seed=config.seed)
  step = training.make_train_step(model, scheds, **loss_kw)
  n_dev = int(config.get("mesh_devices", 0) or 0)
  mesh = sharding.make_mesh(config.get("mesh"), devices=jax.devices()[:n_dev] if n_dev else None)
  return loop_lib.train_loop(init_fn=init_fn, train_step=step, batches=stream, num_steps=num_steps,
                             key=jax.random.key(config.seed), workdir=workdir, mesh=mesh, log_every=config.log_every,
                             checkpoint_every=config.checkpoint_every, config=config, name=name)


def _heldout_mse(model, params, scheds, x, y, key, loss_kw):
  """Per-level eps-MSE on held-out images with fixed times and noise (no label dropout)."""
  kw = {k: v for k, v in loss_kw.items() if k not in ("cond_drop_prob", "mixed_ratio")}
  k_t, k_n = jax.random.split(key)
  t = scheds[0].sample_time(k_t, (x.shape[0],))
  xs = training.model_pyramid(model, x)
  # Level r's noise from fold_in(k_n, r): the 32x32 noise is the same for the nested and the single model.
  noise = [jax.random.normal(jax.random.fold_in(k_n, r), v.shape) for r, v in enumerate(xs)]
  _, aux = training.loss_fn(params, {"x": x, "y": y}, key, model=model, schedules=scheds, train=False, t=t,
                            noise=noise, **kw)
  return aux["mse"]


def run(config: Any, workdir: str) -> dict:
  """Trains one arm (config.arm), samples it jointly, writes samples.png, metrics.jsonl and results.json."""
  os.makedirs(workdir, exist_ok=True)
  if config.arm not in ARMS:
    raise ValueError(f"config.arm must be one of {ARMS}, got {config.arm!r}.")
  ds, arrays = load_images(config.data)
  nets = build(config)
  train_arrays = {"x": arrays["x_train"], "y": arrays["y_train"]}
  lkw = loss_kwargs(config)
  t0 = time.time()
  results: dict[str, Any] = {"arm": config.arm, "image_size": nets["image_shape"][0], "factor": nets["factor"],
                             "power": float(config.diffusion.power)}
  if config.arm == "single":
    model, scheds = nets["single"], nets["schedules"]["single"]
    res = _train(config, workdir, model, scheds, nets["image_shape"], train_arrays, config.num_steps, lkw,
                 name="mdm/single")
  else:
    model, scheds = nets["nested"], nets["schedules"]["nested"]
    inner_params = None
    if config.arm == "progressive":
      low_shape = training.level_shapes(model, 1, nets["image_shape"])[1][1:]
      low_arrays = {"x": np.asarray(training.model_pyramid(model, jnp.asarray(arrays["x_train"]))[1]),
                    "y": arrays["y_train"]}
      res_in = _train(config, os.path.join(workdir, "inner"), nets["inner"], nets["schedules"]["inner"], low_shape,
                      low_arrays, config.inner_steps, _inner_kwargs(config), name="mdm/inner")
      inner_params = jax.device_get(res_in.state.params)
      results["inner_final_loss"] = (res_in.history[-1].get("train/loss") if res_in.history else None)
    res = _train(config, workdir, model, scheds, nets["image_shape"], train_arrays, config.num_steps, lkw,
                 init_params=inner_params, name=f"mdm/{config.arm}")
  results["train_seconds"] = time.time() - t0
  params = jax.device_put(jax.device_get(res.state.params), jax.devices()[0])
  losses = [r["train/loss"] for r in res.history if "train/loss" in r]
  results.update(first_loss=losses[0] if losses else None, final_loss=losses[-1] if losses else None,
                 steps_per_s=res.steps_per_s)
  compile_ = _fast_compile if config.get("fast_compile", False) else lambda f, *a: jax.jit(f)
  n_eval = min(256, arrays["x_eval"].shape[0])
  ev = (params, jnp.asarray(arrays["x_eval"][:n_eval]), jnp.asarray(arrays["y_eval"][:n_eval]))
  mse_fn = lambda p, x, y: _heldout_mse(model, p, scheds, x, y, jax.random.key(123), lkw)  # noqa: E731
  results["heldout_eps_mse"] = [float(v) for v in np.asarray(compile_(mse_fn, *ev)(*ev))]

  s = config.sampler
  labels = jnp.arange(int(s.num_samples)) % 10
  sample_fn = functools.partial(
      training.sample, model=model, schedules=scheds, image_shape=nets["image_shape"], guidance_scale=s.guidance_scale,
      num_steps=int(s.num_steps), method=s.method, eta=float(s.eta), prediction=config.diffusion.prediction,
      clip_x0=s.clip_x0)
  smp_args = (jax.random.key(config.seed + 1), params, labels)
  smp = lambda k, p, y: sample_fn(k, p, labels=y)  # noqa: E731
  levels = [np.asarray(v) for v in compile_(smp, *smp_args)(*smp_args)]
  if not all(np.all(np.isfinite(v)) for v in levels):
    raise FloatingPointError("the sampler produced NaN/inf; lower the learning rate.")
  if len(levels) > 1:
    results["consistency_mse"] = float(np.mean(training.consistency([jnp.asarray(v) for v in levels], model)))
  if config.judge.enabled:
    judge = train_judge(config.judge, arrays)
    results.update({f"samples_{k}": v for k, v in judge.score(levels[0], np.asarray(labels)).items()})
    results["judge_test_accuracy"] = judge.test_accuracy
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0:
    _plot_levels(levels, np.asarray(labels), os.path.join(workdir, "samples.png"),
                 f"mdm {config.arm}: joint samples (rows: digit; left high-res, right low-res upsampled)")
  return results


def _plot_levels(levels, labels, path, title, per_class=4):
  """A grid: each row one digit, per sample the high-res image and every lower level (nearest upsampling)."""
  order = np.concatenate([np.where(labels == c)[0][:per_class] for c in range(10)])
  size = levels[0].shape[1]
  tiles = []
  for i in order:
    row = [levels[0][i]]
    for lv in levels[1:]:
      rep = size // lv.shape[1]
      row.append(np.repeat(np.repeat(lv[i], rep, 0), rep, 1))
    tiles.extend(row)
  grid = (np.stack(tiles) + 1.0) / 2.0
  return metrics_lib.plot_image_grid(grid, path, ncols=per_class * len(levels), title=title)


# --------------------------------------------------------------------------------------------- judge


class Judge:
  """An MNIST CNN (vision.classify) trained on the 32x32 training digits: accuracy on requested labels and
  sliced W2 of its penultimate features against held-out real digits (with the data-vs-data floor)."""

  def __init__(self, model, state, test_accuracy, real_features):
    self.model, self.state, self.test_accuracy, self.real_features = model, state, test_accuracy, real_features

  def logits_features(self, images: np.ndarray):
    from iclr24_jax.vision import classify
    x = np.clip((np.asarray(images, np.float32) + 1.0) / 2.0, 0.0, 1.0)
    return classify.predict(self.model, self.state, x, return_features=True)

  def score(self, images: np.ndarray, labels: np.ndarray, key: jax.Array | None = None) -> dict[str, float]:
    logits, feats = self.logits_features(images)
    out = {"accuracy": float(np.mean(logits.argmax(-1) == labels))}
    out.update(self.feature_sw(feats, key if key is not None else jax.random.key(0)))
    return out

  def feature_sw(self, feats: np.ndarray, key: jax.Array) -> dict[str, float]:
    real = jnp.asarray(self.real_features)
    n = feats.shape[0]
    if n > real.shape[0] // 2:
      raise ValueError(f"{n} samples need at least {2 * n} held-out real digits for the data-vs-data floor.")
    draw = lambda k, m: real[jax.random.choice(k, real.shape[0], (m,), replace=False)]  # noqa: E731
    sw, floor = dmetrics.sliced_wasserstein_vs_data(jnp.asarray(feats), draw, key, num_refs=4, num_projections=128)
    return {"feature_sw": float(sw), "feature_sw_floor": float(floor)}


def train_judge(judge_cfg: Any, arrays: dict[str, np.ndarray]) -> Judge:
  """Trains the MNIST CNN on the training digits (in [0, 1]) and embeds the held-out digits."""
  from iclr24_jax.diffusion.experiment import train_digits_classifier
  to01 = lambda x: ((x + 1.0) / 2.0).astype(np.float32)  # noqa: E731
  n_eval = arrays["x_eval"].shape[0]
  half = n_eval // 2
  ds = data_lib.Dataset("mnist_judge", data_lib.Split(to01(arrays["x_train"]), arrays["y_train"]),
                        data_lib.Split(to01(arrays["x_eval"][:half]), arrays["y_eval"][:half]),
                        data_lib.Split(to01(arrays["x_eval"][half:]), arrays["y_eval"][half:]), 10)
  model, state, acc = train_digits_classifier(judge_cfg, ds)
  j = Judge(model, state, float(acc), None)
  j.real_features = j.logits_features(arrays["x_eval"])[1]
  return j


# ---------------------------------------------------------------------------------------- reproduce


def _fast_compile(fn, *args):
  """jit + compile at XLA backend optimisation level 0 (init programs: compile time dominates on CPU)."""
  lowered = jax.jit(fn).lower(*args)
  try:
    return lowered.compile({"xla_backend_optimization_level": 0})
  except Exception:  # a backend without that option
    return lowered.compile()


def step_flops(model, scheds, image_shape, batch_size, tx, loss_kw) -> float:
  """XLA's FLOP count of one train step (forward + backward + update) at this batch size."""
  step = training.make_train_step(model, scheds, **loss_kw)
  state = jax.eval_shape(lambda k: TrainState.create(training.init_params(k, model, image_shape), tx),
                         jax.random.key(0))
  batch = {"x": jax.ShapeDtypeStruct((batch_size,) + tuple(image_shape), jnp.float32),
           "y": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}
  cost = jax.jit(step).lower(state, batch, jax.random.key(0)).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


class _Arm:
  """One model type's compiled programs, reused for every seed: init, train n steps, evaluate + sample.

  Seeds run one after the other through the same executables (vmapping over seeds would turn every conv into a
  grouped conv, which XLA:CPU compiles and runs far slower).
  """

  def __init__(self, model, scheds, image_shape, batch_size, tx, loss_kw, sample_kw, eval_kw):
    self.model, self.scheds, self.image_shape, self.tx = model, scheds, image_shape, tx
    step = training.make_train_step(model, scheds, **loss_kw)

    def train(state, key, x, y, n):
      def body(_, carry):
        st, loss_sum = carry
        k = jax.random.fold_in(key, st.step)
        k_b, k_s = jax.random.split(k)
        idx = jax.random.randint(k_b, (batch_size,), 0, x.shape[0])
        st, m = step(st, {"x": x[idx], "y": y[idx]}, k_s)
        return st, loss_sum + m["loss"]
      st, loss_sum = jax.lax.fori_loop(0, n, body, (state, jnp.zeros((), jnp.float32)))
      return st, loss_sum / jnp.maximum(n, 1)

    self._train = jax.jit(train, donate_argnums=0)

    def evaluate(params, key, x, y, labels):
      mse = _heldout_mse(model, params, scheds, x, y, jax.random.key(123), loss_kw)  # same (t, noise) for all
      levels = training.sample(key, params, model=model, schedules=scheds, image_shape=image_shape, labels=labels,
                               **sample_kw)
      cons = training.consistency(levels, model) if len(levels) > 1 else jnp.zeros(labels.shape[0])
      return mse, levels, cons

    self._eval = jax.jit(evaluate)
    self.eval_kw = eval_kw
    self._init = {}

  def init(self, key, inner_params=None):
    def one(k, ip):
      p = training.init_params(k, self.model, self.image_shape)
      if ip is not None:
        p = model_lib.load_inner(p, ip)
      return TrainState.create(p, self.tx)
    tag = inner_params is None
    if tag not in self._init:
      self._init[tag] = _fast_compile(one, key, inner_params)
    return self._init[tag](key, inner_params)

  def train(self, state, key, arrays, n):
    return self._train(state, key, arrays["x"], arrays["y"], jnp.asarray(int(n), jnp.int32))

  def evaluate(self, params, key):
    return jax.device_get(self._eval(params, key, *self.eval_kw))


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  """Nested + progressive vs nested from scratch vs single resolution at equal compute (3 seeds)."""
  os.makedirs(workdir, exist_ok=True)
  cfg = _get_config("tiny" if fast else "")
  rp = cfg.repro
  t_start = time.time()
  ds, arrays = load_images(cfg.data)
  nets = build(cfg)
  nested, inner, single = nets["nested"], nets["inner"], nets["single"]
  shape = nets["image_shape"]
  low_shape = training.level_shapes(nested, 1, shape)[1][1:]
  seeds = [int(s) for s in rp.seeds]
  b = int(cfg.batch_size)
  lkw, ikw = loss_kwargs(cfg), _inner_kwargs(cfg)
  tx = make_optimizer(cfg.optimizer, 10 ** 6)     # constant learning rate after warm-up: no horizon needed
  flops = {"nested": step_flops(nested, nets["schedules"]["nested"], shape, b, tx, lkw),
           "inner": step_flops(inner, nets["schedules"]["inner"], low_shape, b, tx, ikw),
           "single": step_flops(single, nets["schedules"]["single"], shape, b, tx, lkw)}
  budget = float(rp.budget_nested_steps) * flops["nested"]          # FLOPs per seed per arm
  n_ck = int(rp.checkpoints)
  fractions = [(i + 1) / n_ck for i in range(n_ck)]
  inner_steps = int(round(rp.inner_fraction * budget / flops["inner"]))
  inner_cost = inner_steps * flops["inner"]
  if fractions[0] * budget < inner_cost:
    raise ValueError("the first checkpoint falls inside the inner pre-training; lower repro.inner_fraction.")

  def steps_at(frac, per_step, offset=0.0):
    return int(round((frac * budget - offset) / per_step))

  # Evaluation inputs: held-out digits with fixed (t, noise) inside _heldout_mse; sample labels 0..9 cycled.
  n_ev = int(rp.eval_examples)
  n_smp = int(rp.samples_per_seed)
  labels = jnp.arange(n_smp) % 10
  eval_kw = (jnp.asarray(arrays["x_eval"][:n_ev]), jnp.asarray(arrays["y_eval"][:n_ev]), labels)
  s = cfg.sampler
  sample_kw = dict(guidance_scale=s.guidance_scale, num_steps=int(rp.sample_steps), method=s.method,
                   eta=float(s.eta), prediction=cfg.diffusion.prediction, clip_x0=s.clip_x0)
  train_arrays = {"x": jnp.asarray(arrays["x_train"]), "y": jnp.asarray(arrays["y_train"])}
  low_arrays = {"x": training.model_pyramid(nested, train_arrays["x"])[1], "y": train_arrays["y"]}

  arm_nested = _Arm(nested, nets["schedules"]["nested"], shape, b, tx, lkw, sample_kw, eval_kw)
  arm_single = _Arm(single, nets["schedules"]["single"], shape, b, tx, lkw, sample_kw, eval_kw)
  arm_inner = _Arm(inner, nets["schedules"]["inner"], low_shape, b, tx, ikw, sample_kw, eval_kw)

  judge = None if fast else train_judge(cfg.judge, arrays)
  # Per seed: key_init, key_train, key_eval (the sampler's key; the held-out (t, noise) is fixed for all).
  keys = {sd: [jax.random.fold_in(jax.random.key(sd), i) for i in range(3)] for sd in seeds}
  results = {arm: [dict() for _ in fractions] for arm in ARMS}   # per checkpoint: metric -> [per seed]
  samples_last = {}
  timing = {arm: dict(seconds=0.0) for arm in ARMS}

  def record(arm_obj, state, arm, ck, sd):
    mse, levels, cons = arm_obj.evaluate(state.params, keys[sd][2])
    rec = results[arm][ck]
    rec.setdefault("eps_mse", []).append(float(np.asarray(mse)[0]))
    if len(levels) > 1:
      rec.setdefault("consistency", []).append(float(np.mean(cons)))
    if judge is not None:
      sc = judge.score(np.asarray(levels[0]), np.asarray(labels), jax.random.key(1000 + ck))
      for k in ("accuracy", "feature_sw", "feature_sw_floor"):
        rec.setdefault(k, []).append(sc[k])
    if sd == seeds[0]:
      samples_last[arm] = [np.asarray(lv) for lv in levels]

  for sd in seeds:
    k_init, k_train, _ = keys[sd]
    # Single resolution and nested from scratch: train to each checkpoint, evaluate.
    for arm, arm_obj, per_step in (("single", arm_single, flops["single"]), ("nested", arm_nested, flops["nested"])):
      t0 = time.time()
      state, done = arm_obj.init(k_init), 0
      for ck, frac in enumerate(fractions):
        n = steps_at(frac, per_step) - done
        state, _ = arm_obj.train(state, k_train, train_arrays, n)
        done += n
        record(arm_obj, state, arm, ck, sd)
      timing[arm].update(steps=done, seconds=timing[arm]["seconds"] + time.time() - t0)
    # Progressive: the low-resolution UNet first (inner_fraction of the budget), then the NestedUNet.
    t0 = time.time()
    st_in = arm_inner.init(k_init)
    st_in, _ = arm_inner.train(st_in, k_train, low_arrays, inner_steps)
    state, done = arm_nested.init(jax.random.fold_in(k_init, 7), st_in.params), 0
    for ck, frac in enumerate(fractions):
      n = steps_at(frac, flops["nested"], inner_cost) - done
      state, _ = arm_nested.train(state, jax.random.fold_in(k_train, 7), train_arrays, n)
      done += n
      record(arm_nested, state, "progressive", ck, sd)
    timing["progressive"].update(inner_steps=inner_steps, steps=done,
                                 seconds=timing["progressive"]["seconds"] + time.time() - t0)
  results = {arm: [{k: np.asarray(v) for k, v in rec.items()} for rec in recs] for arm, recs in results.items()}

  rows = _rows(cfg, results, fractions, flops, budget, inner_steps, timing, judge, workdir, samples_last, labels,
               fast, time.time() - t_start)
  return rows


def _mean_se_str(x):
  m, se = stats.mean_se(x)
  return f"{m:.4g}+-{se:.2g}"


def _rows(cfg, results, fractions, flops, budget, inner_steps, timing, judge, workdir, samples_last, labels, fast,
          seconds):
  exp = (f"MNIST-5k 32->8 (2 levels), equal train compute {budget / 1e12:.2f} TFLOP/seed, "
         f"{len(cfg.repro.seeds)} seeds") if not fast else "tiny digits 16->8 (plumbing check)"
  budget_note = (f"XLA FLOPs/step (batch {cfg.batch_size}): nested {flops['nested'] / 1e9:.2f} G, single "
                 f"{flops['single'] / 1e9:.2f} G, inner {flops['inner'] / 1e9:.2f} G; steps: single "
                 f"{timing['single']['steps']}, nested {timing['nested']['steps']}, progressive {inner_steps} inner + "
                 f"{timing['progressive']['steps']} nested; measured s: "
                 + ", ".join(f"{k} {v['seconds']:.0f}" for k, v in timing.items()))
  plots = _plot_curves(results, fractions, budget, workdir)
  grid = os.path.join(workdir, "samples_final.png")
  _plot_arms(samples_last, np.asarray(labels), grid)
  plots = plots + [grid]
  claim = "nested + progressive converges faster than a single-resolution model (Sec. 5, Fig. 6 / Table 4)"
  rows = []
  last = -1
  pr, ne, si = results["progressive"][last], results["nested"][last], results["single"][last]
  if fast:
    rows.append(dict(paper=PAPER, experiment=exp, metric="held-out 32x32 eps-MSE (final)",
                     ours=f"progressive {_mean_se_str(pr['eps_mse'])}, nested {_mean_se_str(ne['eps_mse'])}, single "
                          f"{_mean_se_str(si['eps_mse'])}", paper_value=claim, holds=None, notes=budget_note,
                     plots=plots))
    return rows
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric="held-out high-res eps-MSE at the full budget (lower is better)",
      a=pr["eps_mse"], b=si["eps_mse"], name_a="nested+progressive", name_b="single-res", direction="less",
      paper_value=claim, notes=budget_note, plots=plots))
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric="MNIST-CNN accuracy on samples of the requested digit (full budget)",
      a=pr["accuracy"], b=si["accuracy"], name_a="nested+progressive", name_b="single-res", direction="greater",
      paper_value=claim + "; FID in the paper, a digit classifier here",
      notes=f"{cfg.repro.samples_per_seed} samples/seed, DDIM {cfg.repro.sample_steps} steps, CFG w="
            f"{cfg.sampler.guidance_scale}; the CNN scores {judge.test_accuracy:.3f} on real held-out digits",
      plots=plots))
  floor = np.mean([pr["feature_sw_floor"], si["feature_sw_floor"]])
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric="sliced W2 of CNN features, samples vs real digits (full budget)",
      a=pr["feature_sw"], b=si["feature_sw"], name_a="nested+progressive", name_b="single-res", direction="less",
      paper_value=claim + "; FID in the paper", notes=f"data-vs-data floor {floor:.3g} at the same sample size",
      plots=plots))
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric="held-out high-res eps-MSE at the full budget: progressive vs scratch",
      a=pr["eps_mse"], b=ne["eps_mse"], name_a="nested+progressive", name_b="nested (scratch)", direction="less",
      paper_value="progressive training (low resolution first) speeds up the nested model (Sec. 3.3)",
      notes=budget_note, plots=plots))
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric="MNIST-CNN accuracy on samples: progressive vs scratch (full budget)",
      a=pr["accuracy"], b=ne["accuracy"], name_a="nested+progressive", name_b="nested (scratch)", direction="greater",
      paper_value="progressive training (low resolution first) speeds up the nested model (Sec. 3.3)",
      notes="", plots=plots))
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric="held-out high-res eps-MSE at the full budget: nested (scratch) vs single",
      a=ne["eps_mse"], b=si["eps_mse"], name_a="nested (scratch)", name_b="single-res", direction="less",
      paper_value="the nested UNet alone (no progressive stage) also beats the single-resolution baseline (Fig. 6)",
      notes="", plots=plots))
  curve = "; ".join(
      f"{int(round(f * 100))}%: " + ", ".join(
          f"{a} acc {np.mean(results[a][i]['accuracy']):.2f} mse {np.mean(results[a][i]['eps_mse']):.3f}"
          for a in ARMS) for i, f in enumerate(fractions))
  rows.append(dict(paper=PAPER, experiment=exp, metric="learning curves (mean over seeds) at 1/3, 2/3, 3/3 budget",
                   ours=curve, paper_value=claim, holds=None, notes=f"reproduction wall time {seconds:.0f} s",
                   plots=plots))
  rows.append(dict(paper=PAPER, experiment=exp, metric="cross-level consistency ||avgpool(x32) - x8||^2 of joint "
                   "samples (per pixel, [-1, 1] scale)",
                   ours=f"progressive {_mean_se_str(pr['consistency'])}, nested {_mean_se_str(ne['consistency'])}",
                   paper_value="joint sampling keeps the resolutions consistent (a measurement, no claim)",
                   holds=None, notes="", plots=[grid]))
  return rows


def _plot_curves(results, fractions, budget, workdir):
  path = os.path.join(workdir, "curves.png")
  keys = [k for k in ("eps_mse", "accuracy", "feature_sw") if results["single"][0].get(k) is not None]
  fig, axes = metrics_lib.new_figure(ncols=len(keys), size=(3.6, 3.0))
  x = [f * budget / 1e12 for f in fractions]
  for ax, k in zip(axes[0], keys):
    for arm in ARMS:
      ms = [stats.mean_se(r[k]) for r in results[arm]]
      ax.errorbar(x, [m for m, _ in ms], yerr=[2 * se for _, se in ms], marker="o", capsize=3, label=ARM_NAMES[arm])
    ax.set_xlabel("train compute per seed (TFLOP)")
    ax.set_title(k, fontsize=9)
  axes[0, 0].legend(fontsize=7)
  metrics_lib.save_figure(fig, path)
  return [path]


def _plot_arms(samples_last, labels, path, per_class=2):
  order = np.concatenate([np.where(labels == c)[0][:per_class] for c in range(10)])
  tiles = []
  for arm in ARMS:
    tiles.extend(samples_last[arm][0][order])
  grid = (np.stack(tiles) + 1.0) / 2.0
  return metrics_lib.plot_image_grid(grid, path, ncols=len(order),
                                     title="seed 0, full budget; rows: " + " / ".join(ARM_NAMES[a] for a in ARMS))


# --------------------------------------------------------------------------------------------- benchmark


def benchmark(quick: bool = True) -> list[dict]:
  """Train step/s of the NestedUNet vs the single-resolution UNet (same outer size), on 1 and all devices."""
  cfg = _get_config("")
  nets = build(cfg)
  lkw = loss_kwargs(cfg)
  tx = make_optimizer(cfg.optimizer, 1000)
  batch_size = 32 if quick else 128
  rows = []
  rng = np.random.default_rng(0)
  x = rng.uniform(-1, 1, (batch_size,) + nets["image_shape"]).astype(np.float32)
  y = (np.arange(batch_size) % 10).astype(np.int32)
  for n_dev in sorted({1, jax.device_count()}):
    mesh = sharding.make_mesh(devices=jax.devices()[:n_dev])
    rep = sharding.replicated_sharding(mesh)
    batch = sharding.shard_batch({"x": x, "y": y}, mesh)
    for name in ("nested", "single"):
      model, scheds = nets[name], nets["schedules"][name]
      state = jax.jit(lambda k, m=model: TrainState.create(training.init_params(k, m, nets["image_shape"]), tx),
                      out_shardings=rep)(jax.random.key(0))
      fn = loop_lib.compile_step(training.make_train_step(model, scheds, **lkw), mesh)
      rows.append(bench.time_fn(fn, state, batch, jax.random.key(1), carry=True, repeats=3 if quick else 10,
                                items=batch_size, name=f"mdm/{name}_train_step", size="32x32" + (
                                    "+8x8" if name == "nested" else ""), batch=batch_size, mesh_devices=n_dev))
  return rows
