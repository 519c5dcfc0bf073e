"""The joint multi-resolution diffusion loss, the train step and the joint sampler of Matryoshka Diffusion.

Loss (paper Eq. 4 / official `NestedDiffusion.get_loss` with the released run's settings):
  t ~ U{0..T-1} shared by all levels, eps_r ~ N(0, I) independent per level,
  x_t^r = sqrt(abar_r(t)) x^r + sqrt(1 - abar_r(t)) eps_r      (abar_r from level r's shifted schedule)
  the network predicts v for every level; v is converted to eps and
  L = sum_r w_r mean_pixels (eps_hat_r - eps_r)^2             (official: prediction_type V_PREDICTION,
                                                               loss_target_type DDPM, use_double_loss, w_r = 1)
Mixed ratio (official `mixed_ratio`): level r runs on the first m_r B examples only and its loss is the mean over
those (the official code divides by m_r after zeroing the others; the same number).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import checks
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.diffusion import process, samplers
from iclr24_jax.papers.mdm.model import NestedUNet, apply_model, num_levels


def level_factors(model: nn.Module) -> tuple[int, ...]:
  """Downsampling factors between consecutive levels (high to low); () for a plain UNet."""
  out = []
  while isinstance(model, NestedUNet):
    out.append(model.factor)
    model = model.inner
  return tuple(out)


def model_pyramid(model: nn.Module, x: jax.Array) -> list[jax.Array]:
  """The model's input levels for clean images x [B, H, W, C] (average pooling by each nesting's factor).

  Args:
    model: a UNet (one level) or NestedUNet.
    x: [B, H, W, C] images.

  Returns:
    list of L arrays [B, H_r, W_r, C], high to low.

  Raises:
    ValueError: a level's size is not divisible by its factor.
  """
  levels = [x]
  for f in level_factors(model):
    b, h, w, c = levels[-1].shape
    if h % f or w % f:
      raise ValueError(f"images of size {h}x{w} cannot be average-pooled by {f}; pad them.")
    levels.append(levels[-1].reshape(b, h // f, f, w // f, f, c).mean(axis=(2, 4)))
  return levels


def level_shapes(model: nn.Module, batch: int, image_shape: Sequence[int]) -> list[tuple[int, ...]]:
  """[(B, H_r, W_r, C)] for every level of the model, high to low.

  Args:
    model: a UNet or NestedUNet.
    batch: B.
    image_shape: (H, W, C) of the highest level.

  Returns:
    list of L shape tuples.
  """
  h, w, c = (int(v) for v in image_shape)
  shapes = [(batch, h, w, c)]
  for f in level_factors(model):
    h, w = h // f, w // f
    shapes.append((batch, h, w, c))
  return shapes


def _check_schedules(model, schedules, where: str = "mdm"):
  if len(schedules) != num_levels(model):
    raise checks.ShapeError(f"{where}: the model has {num_levels(model)} levels but {len(schedules)} schedules were "
                            "given (use mdm.level_schedules(base, num_levels, factor, power)).")


def _check_labels(where: str, labels: Any, num_classes: int) -> Any:
  checks.dtype(where, "labels", labels, "integer", f"class ids in [0, {num_classes}).")
  return checks.require(
      where, (checks.xp(labels).asarray(labels) >= 0) & (labels < num_classes), checks.LabelError,
      f"class labels must lie in [0, {num_classes}) (num_classes = {num_classes}; the null label {num_classes} of "
      "classifier-free guidance is set by cond_drop_prob / guidance_scale, not passed in).")


def _mixed_rows(mixed_ratio, levels: int, batch: int) -> list[int]:
  if mixed_ratio is None:
    return [batch] * levels
  m = [float(v) for v in mixed_ratio]
  if len(m) != levels or any(not 0 < v <= 1 for v in m) or any(a > b for a, b in zip(m, m[1:])) or m[-1] != 1:
    raise ValueError(f"mixed_ratio must give one fraction in (0, 1] per level (high to low), non-decreasing and "
                     f"ending in 1, e.g. (2/3, 1) for the official '2:1'; got {mixed_ratio}.")
  return [max(1, int(v * batch)) for v in m]


def loss_fn(params: Any, batch: Mapping[str, Any], key: jax.Array, *, model: nn.Module,
            schedules: Sequence[Any], prediction: str = "v", loss_target: str = "eps",
            level_weights: Sequence[float] | None = None, mixed_ratio: Sequence[float] | None = None,
            cond_drop_prob: float = 0.0, train: bool = True, t: jax.Array | None = None,
            noise: Sequence[jax.Array] | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The MDM loss of one batch.   # Sec. 3.1, Eq. (4)

  Args:
    params: the model's params.
    batch: {'x': [B, H, W, C] clean images in [-1, 1], optional 'y': [B] int labels}.
    key: draws t, the per-level noise and the label dropout.
    model: a NestedUNet (or a plain UNet: single-resolution diffusion with the same loss).
    schedules: one schedule per level (high to low), sharing the time index (`mdm.level_schedules`).
    prediction: what the network predicts ('v' in the official run).
    loss_target: the space of the regression loss ('eps' in the official run: loss_target_type DDPM).
    level_weights: w_r per level (default 1 each; official multi_res_weights unset).
    mixed_ratio: optional per-level fractions of the batch (high to low), e.g. (2/3, 1).
    cond_drop_prob: label dropout to the null label (model num_classes) for classifier-free guidance.
    train: dropout on.
    t: optional fixed times [B]; noise: optional fixed per-level noises (for held-out evaluation).

  Returns:
    (scalar loss, aux dict: 'mse' [L] per-level mean squared error in the loss_target space,
    'loss_per_level' [L] the weighted terms). Class labels outside [0, num_classes) raise `checks.LabelError`
    eagerly and give a NaN loss under jit / vmap; NaN images give a NaN loss.
  """
  where = "mdm.loss_fn"
  _check_schedules(model, schedules, where)
  x = batch["x"]
  if np.ndim(x) != 4:
    raise checks.ShapeError(f"{where}: batch['x'] must be images [B, H, W, C], got shape {np.shape(x)}.")
  checks.dtype(where, "batch['x']", x, "float")
  checks.nonempty(where, "batch['x']", np.shape(x)[0], "images")
  checks.in_range(where, "cond_drop_prob", cond_drop_prob, 0.0, 1.0, hint="the label dropout probability of "
                  "classifier-free guidance.")
  checks.shapes(where, x=(x, "B H W C"), t=(t, "B"))
  b = x.shape[0]
  levels = len(schedules)
  weights = [1.0] * levels if level_weights is None else [float(w) for w in level_weights]
  if len(weights) != levels:
    raise ValueError(f"level_weights needs {levels} values, got {len(weights)}.")
  rows = _mixed_rows(mixed_ratio, levels, b)
  key_t, key_n, key_drop, key_dropout = jax.random.split(key, 4)
  if t is None:
    t = schedules[0].sample_time(key_t, (b,))
  x0s = model_pyramid(model, x)
  if noise is None:
    noise = [jax.random.normal(k, x0.shape, x0.dtype) for k, x0 in zip(jax.random.split(key_n, levels), x0s)]
  abars = [s.alpha_bar(t) for s in schedules]
  xts = [process.q_sample(x0, a, n) for x0, a, n in zip(x0s, abars, noise)]
  kw = {}
  num_classes = _num_classes(model)
  ok = True
  if num_classes:
    if "y" not in batch:
      raise checks.ContractError(f"{where}: the model is class-conditional (num_classes={num_classes}): the batch "
                                 "needs 'y'.")
    checks.shapes(where, known={"B": b}, y=(batch["y"], "B"))
    ok = _check_labels(where, batch["y"], num_classes)
    y = jnp.asarray(batch["y"], jnp.int32)
    if cond_drop_prob > 0:
      y = jnp.where(jax.random.bernoulli(key_drop, cond_drop_prob, (b,)), num_classes, y)
    kw["class_labels"] = y
  inputs = [xt[:n] for xt, n in zip(xts, rows)]
  outs = apply_model(model, params, inputs, t, train=train, rngs={"dropout": key_dropout}, **kw)
  mses, terms = [], []
  for r in range(levels):
    n = rows[r]
    a = abars[r][:n]
    pred = process.convert(inputs[r], outs[r], a, prediction, loss_target)
    target = process.target_for(x0s[r][:n], noise[r][:n], a, loss_target)
    mse = jnp.mean((pred - target) ** 2)                      # mean over the level's rows and pixels
    mses.append(mse)
    terms.append(weights[r] * mse)
  loss = sum(terms)
  return checks.poison((loss, {"mse": jnp.stack(mses), "loss_per_level": jnp.stack(terms)}), ok)


def _num_classes(model: nn.Module) -> int:
  while isinstance(model, NestedUNet):
    model = model.inner
  return int(getattr(model, "num_classes", 0))


def init_params(key: jax.Array, model: nn.Module, image_shape: Sequence[int]) -> Any:
  """Initial params of a UNet / NestedUNet for images [H, W, C] (batch 1; class label 0 when conditional).

  Args:
    key: PRNG key.
    model: a UNet or NestedUNet.
    image_shape: (H, W, C) of the highest level.

  Returns:
    the params pytree.
  """
  xs = [jnp.zeros(s, jnp.float32) for s in level_shapes(model, 1, image_shape)]
  kw = {"class_labels": jnp.zeros((1,), jnp.int32)} if _num_classes(model) else {}
  if isinstance(model, NestedUNet):
    return model.init(key, xs, jnp.zeros((1,), jnp.float32), **kw)["params"]
  return model.init(key, xs[0], jnp.zeros((1,), jnp.float32), **kw)["params"]


def make_train_step(model: nn.Module, schedules: Sequence[Any], **loss_kw) -> Callable:
  """train_step(state, batch, key) -> (state, metrics) for a TrainState of the model (un-jitted; pure).

  Args:
    model, schedules, **loss_kw: as `loss_fn` (prediction, loss_target, level_weights, mixed_ratio, cond_drop_prob).

  Returns:
    the step; metrics: loss, grad_norm and mse_level{r} per level.
  """
  _check_schedules(model, schedules)

  def train_step(state: TrainState, batch: Mapping[str, Any], key: jax.Array):
    key = jax.random.fold_in(key, state.step)
    (loss, aux), grads = jax.value_and_grad(
        lambda p: loss_fn(p, batch, key, model=model, schedules=schedules, **loss_kw), has_aux=True)(state.params)
    metrics = {"loss": loss, "grad_norm": optax.global_norm(grads)}
    metrics.update({f"mse_level{r}": aux["mse"][r] for r in range(len(schedules))})
    return state.apply_gradients(grads), metrics

  return train_step


def sample(key: jax.Array, params: Any, *, model: nn.Module, schedules: Sequence[Any], image_shape: Sequence[int],
           labels: jax.Array | None = None, batch: int | None = None, guidance_scale: float | None = None,
           num_steps: int = 50, method: str = "ddim", eta: float = 0.0, prediction: str = "v",
           clip_x0: float | None = 1.0, spacing: str = "trailing") -> list[jax.Array]:
  """Joint sampling of every resolution (official NestedSampler), one `lax.scan` over the time grid.

  At each step the network sees all levels at the shared t; each level takes a DDIM / DDPM step with its own
  shifted schedule, its x0 estimate clipped to [-1, 1] (official threshold CLIP); classifier-free guidance
  (official `forward_model`) guides every level: out_null + w (out_label - out_null).

  Args:
    key: randomness.
    params: the model's params.
    model: a NestedUNet or a UNet.
    schedules: one schedule per level (high to low).
    image_shape: (H, W, C) of the highest level.
    labels: [B] int class labels (class-conditional models); B = batch otherwise.
    batch: number of samples when unconditional.
    guidance_scale: w (None or 1: no guidance; needs labels).
    num_steps: sampler steps.
    method, eta: 'ddim' (eta 0: deterministic) or 'ddpm'.
    prediction: the network's output type.
    clip_x0: clip of the x0 estimate (None: off).
    spacing: the time grid ('trailing' starts at the noisiest step, t = T - 1).

  Returns:
    list of L samples [B, H_r, W_r, C], high to low resolution (NaN under jit for labels outside
    [0, num_classes); eager calls raise).
  """
  where = "mdm.sample"
  _check_schedules(model, schedules, where)
  num_classes = _num_classes(model)
  if num_classes and labels is None:
    raise checks.ContractError(f"{where}: the model is class-conditional (num_classes={num_classes}): pass labels "
                               "[B].")
  ok = True
  if labels is not None:
    checks.shapes(where, labels=(labels, "B"))
    if num_classes:
      ok = _check_labels(where, labels, num_classes)
    labels = jnp.asarray(labels, jnp.int32)
    batch = labels.shape[0]
  if batch is None:
    raise checks.ContractError(f"{where}: pass labels [B] or batch=B.")
  batch = checks.static_int(where, "batch", batch, low=1)
  num_steps = checks.static_int(where, "num_steps", num_steps, low=1)
  checks.in_range(where, "eta", eta, 0.0, None)
  shapes = level_shapes(model, batch, image_shape)

  def den(xs, t, c=None):
    kw = {"class_labels": c} if c is not None else {}
    return tuple(apply_model(model, params, list(xs), t, **kw))

  guided = guidance_scale is not None and float(guidance_scale) != 1.0
  out = samplers.sample_levels(
      key, den, tuple(schedules), shapes, method=method, num_steps=num_steps, spacing=spacing, eta=eta,
      prediction=prediction, clip_x0=clip_x0, cond=labels if num_classes else None,
      null_cond=jnp.full((1,), num_classes, jnp.int32) if guided else None,
      guidance_scale=float(guidance_scale) if guided else None)
  return checks.poison([jnp.clip(x, -1.0, 1.0) for x in out], ok)   # official _postprocess clips the final images


def consistency(samples: Sequence[jax.Array], model: nn.Module) -> jax.Array:
  """Cross-level consistency of joint samples: mean over pixels of ||avgpool(x_0) - x_{L-1}||^2 -> [B].

  Args:
    samples: L sampled levels [B, H_r, W_r, C], high to low.
    model: the NestedUNet (its factors define the pooling).

  Returns:
    [B] float mean squared difference between the pooled highest level and the lowest level.
  """
  pooled = model_pyramid(model, samples[0])[-1]
  return jnp.mean(((pooled - samples[-1]) ** 2).reshape(pooled.shape[0], -1), axis=-1)


def null_label(model: nn.Module) -> int:
  """The null class label of a class-conditional model (num_classes)."""
  return _num_classes(model)


__all__ = ["loss_fn", "make_train_step", "init_params", "sample", "consistency", "level_factors", "level_shapes",
           "model_pyramid", "null_label"]
