"""MDM pieces that the runs and the equal-compute study share, built from a config.

`load_images` (MNIST-5k at 32x32 or the tiny digits, in [-1, 1]), `build` (the NestedUNet, its inner network and
the single-resolution UNet with their level schedules), `loss_kwargs` / `inner_kwargs`, `heldout_mse` (per-level
eps-MSE at fixed times and noise), `step_flops` (XLA FLOPs of one train step) and `Arm` (one model
type's compiled init / train-n-steps / evaluate-and-sample programs). The model is in `model.py`, the losses,
steps and samplers in `train.py`, the sample judge in `judge.py`; `experiment.run` trains one arm; the study is
in `study.py`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import data as data_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.diffusion import schedules as schedules_lib
from iclr24_jax.papers.mdm import model as model_lib
from iclr24_jax.papers.mdm import train


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
  factors = train.level_factors(nested)
  if len(set(factors)) != 1:
    raise ValueError(f"the reproduction expects one factor between levels, got {factors}.")
  scheds = model_lib.level_schedules(base, levels, factors[0], float(d.power))
  size = int(config.data.image_size)
  return {"nested": nested, "inner": inner, "single": single, "image_shape": (size, size, 1), "factor": factors[0],
          "schedules": {"nested": scheds, "inner": scheds[1:], "single": scheds[:1]}}


def loss_kwargs(config: Any) -> dict[str, Any]:
  """The `train.loss_fn` keyword arguments from config.diffusion.

  Args:
    config: the mdm ConfigDict (diffusion: prediction, loss_target, level_weights, mixed_ratio, cond_drop_prob).

  Returns:
    dict prediction, loss_target, level_weights (tuple or None), mixed_ratio (tuple or None),
    cond_drop_prob (float).
  """
  d = config.diffusion
  return dict(prediction=d.prediction, loss_target=d.loss_target,
              level_weights=None if d.level_weights is None else tuple(d.level_weights),
              mixed_ratio=None if d.mixed_ratio is None else tuple(d.mixed_ratio),
              cond_drop_prob=float(d.cond_drop_prob))


def inner_kwargs(config: Any) -> dict[str, Any]:
  """`loss_kwargs` for the inner (low-resolution) network alone: level weights / mixed ratio without level 0."""
  kw = loss_kwargs(config)
  for k in ("level_weights", "mixed_ratio"):
    if kw[k] is not None:
      kw[k] = kw[k][1:]
  return kw


def heldout_mse(model, params, scheds, x, y, key, loss_kw):
  """Per-level eps-MSE on held-out images with fixed times and noise (no label dropout).

  Args:
    model: the NestedUNet (or a single UNet); params: its parameters; scheds: per-level schedules.
    x: [B, H, W, C] high-resolution images in [-1, 1]; y: [B] int labels; key: PRNG key.
    loss_kw: `loss_kwargs(config)`.

  Returns:
    [R] eps-MSE per level (high -> low).
  """
  kw = {k: v for k, v in loss_kw.items() if k not in ("cond_drop_prob", "mixed_ratio")}
  k_t, k_n = jax.random.split(key)
  t = scheds[0].sample_time(k_t, (x.shape[0],))
  xs = train.model_pyramid(model, x)
  # Level r's noise from fold_in(k_n, r): the 32x32 noise is the same for the nested and the single model.
  noise = [jax.random.normal(jax.random.fold_in(k_n, r), v.shape) for r, v in enumerate(xs)]
  _, aux = train.loss_fn(params, {"x": x, "y": y}, key, model=model, schedules=scheds, train=False, t=t,
                            noise=noise, **kw)
  return aux["mse"]


def step_flops(model, scheds, image_shape, batch_size, tx, loss_kw) -> float:
  """XLA's FLOP count of one train step (forward + backward + update) at this batch size.

  Args:
    model: the UNet / NestedUNet.
    scheds: one schedule per level.
    image_shape: (H, W, C) of the highest level.
    batch_size: B.
    tx: the optimizer.
    loss_kw: `train.loss_fn` keyword arguments.

  Returns:
    float FLOPs (from the lowered program's cost analysis; nothing is run).
  """
  step = train.make_train_step(model, scheds, **loss_kw)
  state = jax.eval_shape(lambda k: TrainState.create(train.init_params(k, model, image_shape), tx),
                         jax.random.key(0))
  batch = {"x": jax.ShapeDtypeStruct((batch_size,) + tuple(image_shape), jnp.float32),
           "y": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}
  cost = jax.jit(step).lower(state, batch, jax.random.key(0)).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


class Arm:
  """One model type's compiled programs, reused for every seed: init, train n steps, evaluate + sample.

  Seeds run one after the other through the same executables (vmapping over seeds would turn every conv into a
  grouped conv, which XLA:CPU compiles and runs far slower).
  """

  def __init__(self, model, scheds, image_shape, batch_size, tx, loss_kw, sample_kw, eval_kw):
    self.model, self.scheds, self.image_shape, self.tx = model, scheds, image_shape, tx
    step = train.make_train_step(model, scheds, **loss_kw)

    def one(st, i, key, x, y):
      del i   # the batch and noise follow st.step
      k = jax.random.fold_in(key, st.step)
      k_b, k_s = jax.random.split(k)
      idx = jax.random.randint(k_b, (batch_size,), 0, x.shape[0])
      st, m = step(st, {"x": x[idx], "y": y[idx]}, k_s)
      return st, {"loss": m["loss"]}

    # `common.loop.repeat_step`: on CPU a host loop of one jitted step (XLA:CPU runs the UNet's conv backward
    # passes several times slower inside a loop, `loop_grads_are_slow`); elsewhere one fori_loop, n traced.
    self._run = {loop: loop_lib.repeat_step(one, loop=loop, donate=True) for loop in (True, False)}
    self._host_loop = loop_lib.loop_grads_are_slow()

    def evaluate(params, key, x, y, labels):
      mse = heldout_mse(model, params, scheds, x, y, jax.random.key(123), loss_kw)  # same (t, noise) for all
      levels = train.sample(key, params, model=model, schedules=scheds, image_shape=image_shape, labels=labels,
                               **sample_kw)
      cons = train.consistency(levels, model) if len(levels) > 1 else jnp.zeros(labels.shape[0])
      return mse, levels, cons

    self._eval = jax.jit(evaluate)
    self.eval_kw = eval_kw
    self._init = {}

  def init(self, key, inner_params=None):
    """A TrainState for one seed: fresh params (key), with `inner_params` loaded into the inner network if given."""
    def one(k, ip):
      p = train.init_params(k, self.model, self.image_shape)
      if ip is not None:
        p = model_lib.load_inner(p, ip)
      return TrainState.create(p, self.tx)
    tag = inner_params is None
    if tag not in self._init:
      self._init[tag] = loop_lib.compile_fast(one, key, inner_params)
    return self._init[tag](key, inner_params)

  def train(self, state, key, arrays, n):
    """n steps on arrays {'x': [N, H, W, C], 'y': [N]} with on-device batches -> (state, mean loss)."""
    state, m = self._run[not self._host_loop](state, 0, int(n), key, arrays["x"], arrays["y"])
    return state, m["loss"]

  def evaluate(self, params, key, labels=None):
    """(held-out eps-MSE per level [R], sampled levels, cross-level consistency [B]) on the host.

    Args:
      params: the model's params.
      key: the sampler's key.
      labels: optional [B'] int digits to sample instead of eval_kw's (a new B' compiles the program once more).

    Returns:
      (mse [R], list of L sampled levels [B, H_r, W_r, C], consistency [B]) as numpy arrays.
    """
    x, y, default_labels = self.eval_kw
    return jax.device_get(self._eval(params, key, x, y, default_labels if labels is None else labels))
