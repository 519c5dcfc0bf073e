"""Matryoshka Diffusion Models: the multi-resolution inputs, the shifted schedules and the NestedUNet.

Gu, Zhai, Zhang, Susskind, Jaitly, "Matryoshka Diffusion Models", ICLR 2024, Sec. 3.1-3.2; the official
code is apple/ml-mdm (ml_mdm/models/nested_unet.py, diffusion.py, samplers.py).

Levels are ordered high -> low resolution, as in the official code: level 0 is the full image [B, H, W, C], level
r is avgpool(level r-1) by `factor` ([B, H / factor^r, W / factor^r, C]). All levels share one time t; level r
has the base schedule's log-SNR shifted by -power * log(s_r), where s_r = H_r / H_lowest (Eq. 5 of the paper's
"SNR_r(t) = SNR(t) / s_r^p"; the official `get_schedule_shifted`).

NestedUNet (official `NestedUNet.forward_denoising`): the outer UNet (high resolution, no middle blocks) runs its
down path; its bottleneck features go through a zero-initialised 3x3 conv (`in_adapter`) and are added to the
inner network's stem output; the inner network (a UNet, or a NestedUNet, at the next resolution) denoises the
lower levels and returns its top decoder features, which come back through a zero-initialised 3x3 conv
(`out_adapter`) into the outer bottleneck; the outer up path then predicts the high resolution. The inner
network's parameters live under params['inner'] in exactly the layout of the standalone network, so a trained
low-resolution model loads as the inner network (`load_inner`, progressive training).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.diffusion import schedules as schedules_lib
from iclr24_jax.diffusion.unet import UNet


# ------------------------------------------------------------------------------------------ inputs


def pyramid(x: jax.Array, num_levels: int, factor: int = 2) -> list[jax.Array]:
  """The multi-resolution inputs x^0 = x, x^{r+1} = avgpool(x^r, factor).   # Sec. 3.1

  Args:
    x: [B, H, W, C] images (H, W divisible by factor ** (num_levels - 1)).
    num_levels: L >= 1.
    factor: the downsampling factor between consecutive levels (2 or 4 in the paper).

  Returns:
    a list of L arrays [B, H / factor^r, W / factor^r, C], high to low resolution.
  """
  if x.ndim != 4:
    raise ValueError(f"pyramid expects images [B, H, W, C], got shape {x.shape}.")
  if num_levels < 1 or factor < 2:
    raise ValueError(f"need num_levels >= 1 and factor >= 2, got num_levels={num_levels}, factor={factor}.")
  total = factor ** (num_levels - 1)
  if x.shape[1] % total or x.shape[2] % total:
    raise ValueError(f"{num_levels} levels with factor {factor} need H and W divisible by {total}, got "
                     f"{x.shape[1:3]}; pad the images (MNIST: 28 -> 32).")
  levels = [x]
  for _ in range(num_levels - 1):
    b, h, w, c = levels[-1].shape
    levels.append(levels[-1].reshape(b, h // factor, factor, w // factor, factor, c).mean(axis=(2, 4)))
  return levels


def shifted_log_snr(log_snr: jax.Array, ratio: float, power: float = 1.0) -> jax.Array:
  """log SNR_r(t) = log SNR(t) - p log s_r, i.e. SNR_r = SNR / s_r^p.   # Sec. 3.1, Eq. (5)

  Args:
    log_snr: the base (lowest-resolution) log-SNR, any shape.
    ratio: s_r = resolution of level r / resolution of the lowest level (>= 1).
    power: p; 1 in the official runs (`schedule_shifted_power` default), 2 matches simple diffusion's
      2 log(base / res) shift (`diffusion.schedules.resolution_shift`).
  """
  if ratio <= 0:
    raise ValueError(f"the resolution ratio must be positive, got {ratio}.")
  return log_snr - power * math.log(ratio)


def level_ratios(num_levels: int, factor: int) -> tuple[int, ...]:
  """s_r for r = 0..L-1 (high to low): factor ** (L - 1 - r); the lowest level has s = 1.

  Args:
    num_levels: L.
    factor: resolution ratio between neighbouring levels.

  Returns:
    tuple of L ints.
  """
  return tuple(factor ** (num_levels - 1 - r) for r in range(num_levels))


def level_schedules(base: schedules_lib.DiscreteSchedule, num_levels: int, factor: int, power: float = 1.0
                    ) -> tuple[schedules_lib.DiscreteSchedule, ...]:
  """One discrete schedule per level (high to low), level r shifted by -power * log(s_r).

  Args:
    base: the lowest resolution's schedule (official runs: squaredcos_cap_v2, 1000 steps).
    num_levels, factor: the pyramid.
    power: p of `shifted_log_snr`.

  Returns:
    L DiscreteSchedules sharing the time index t.
  """
  return tuple(schedules_lib.shift_schedule(base, shifted_log_snr(0.0, s, power)) if s > 1 else base
               for s in level_ratios(num_levels, factor))


# ------------------------------------------------------------------------------------------ network


class NestAdapter(nn.Module):
  """The hook the outer UNet calls at its bottleneck (see `diffusion.UNet`'s nesting protocol).

  in_adapter (zero-init 3x3 conv) maps the outer bottleneck features to the inner network's stem width; they are
  added to the inner stem output (`inject`); out_adapter (zero-init 3x3 conv) brings the inner network's top decoder
  features back and adds them to the outer bottleneck. When the outer runs on fewer examples than the inner
  (mixed ratio: only the first B_high examples have a high-resolution branch) the in_adapter features are padded
  with zeros and the inner features are cut to B_high, as the official code does.

  Attributes:
    inner: a UNet (one lower level) or a NestedUNet (several), already bound to the parent NestedUNet.
    inner_channels: the inner network's stem width (base_channels * channel_mults[0]).
    skip_inner_input: the official `skip_inner_unet_input`: no in_adapter (the inner sees only its image).
  """

  inner: nn.Module
  inner_channels: int
  skip_inner_input: bool = False

  @nn.compact
  def __call__(self, h, temb, inner_inputs, *, t, cond=None, class_labels=None, context=None, context_mask=None,
               train: bool = False):
    if inner_inputs is None or "xs" not in inner_inputs:
      raise ValueError("the nested UNet needs the lower-resolution inputs: inner_inputs={'xs': [...], 't': t_all, "
                       "...} (NestedUNet.__call__ builds it).")
    xs_low = inner_inputs["xs"]
    b_high, b_all = h.shape[0], xs_low[0].shape[0]
    feat = None
    if not self.skip_inner_input:
      feat = nn.Conv(self.inner_channels, (3, 3), padding="SAME", kernel_init=nn.initializers.zeros,
                     bias_init=nn.initializers.zeros, name="in_adapter")(h)
      if b_high < b_all:  # pad zeros for the examples without a high-resolution branch
        feat = jnp.concatenate([feat, jnp.zeros((b_all - b_high,) + feat.shape[1:], feat.dtype)])
    kw = dict(cond=inner_inputs.get("cond"), class_labels=inner_inputs.get("class_labels"),
              context=inner_inputs.get("context"), context_mask=inner_inputs.get("context_mask"), train=train)
    if isinstance(self.inner, NestedUNet):
      preds_low, feat_low = self.inner(xs_low, inner_inputs["t"], inject=feat, return_features=True, **kw)
    else:
      if len(xs_low) != 1:
        raise ValueError(f"a plain inner UNet denoises one level; got {len(xs_low)} lower levels.")
      pred, feat_low = self.inner(xs_low[0], inner_inputs["t"], inject=feat, return_features=True, **kw)
      preds_low = [pred]
    back = nn.Conv(h.shape[-1], (3, 3), padding="SAME", kernel_init=nn.initializers.zeros,
                   bias_init=nn.initializers.zeros, name="out_adapter")(feat_low[:b_high])
    return h + back, list(preds_low)


class NestedUNet(nn.Module):
  """MDM's NestedUNet: an outer UNet whose bottleneck is an inner (nested) network.   # Sec. 3.2, Fig. 2

  Call: model(xs, t, *, class_labels=None, cond=None, context=None, context_mask=None, inject=None, train=False,
  return_features=False) -> list of L predictions (high to low), plus the outer decoder features with
  return_features.

  Attributes:
    outer: the high-resolution UNet (its `inner` field is replaced by the adapter; MDM uses mid_blocks=False).
      Its bottleneck resolution H / 2^(len(channel_mults) - 1) must equal the next level's resolution.
    inner: a UNet (two levels in all) or a NestedUNet (more levels) for the lower resolutions. Its params are
      params['inner'] (the standalone layout).
    skip_inner_input: official `skip_inner_unet_input` (default False).
  """

  outer: UNet
  inner: nn.Module
  skip_inner_input: bool = False

  @property
  def factor(self) -> int:
    """Resolution ratio between this network's level and the next: 2 ** (outer levels - 1)."""
    return 2 ** (len(self.outer.channel_mults) - 1)

  @property
  def num_levels(self) -> int:
    return 1 + (self.inner.num_levels if isinstance(self.inner, NestedUNet) else 1)

  @nn.compact
  def __call__(self, xs: Sequence[jax.Array], t: jax.Array, *, class_labels=None, cond=None, context=None,
               context_mask=None, inject=None, train: bool = False, return_features: bool = False):
    """Predicts every level.

    Args:
      xs: L noisy images [B_r, H_r, W_r, C], high to low resolution, H_{r+1} = H_r / factor_r. With a mixed
        ratio the higher levels may have fewer rows (the first B_r examples), B_0 <= ... <= B_{L-1} = B.
      t: [B] (or a scalar) time shared by all levels.
      class_labels, cond, context, context_mask: conditioning with leading axis B.
      inject: features added to the outer stem (when this network is itself nested).
      train: dropout.
      return_features: also return the outer decoder features [B_0, H_0, W_0, C_outer].

    Returns:
      list of L predictions [B_r, H_r, W_r, out_channels]; with return_features, (list, features).
    """
    xs = list(xs)
    if len(xs) != self.num_levels:
      raise ValueError(f"this NestedUNet has {self.num_levels} levels; got {len(xs)} inputs.")
    for a, b in zip(xs[:-1], xs[1:]):
      if a.ndim != 4 or b.ndim != 4 or a.shape[1] % b.shape[1] or a.shape[2] % b.shape[2]:
        raise ValueError(f"level shapes {[x.shape for x in xs]} do not form a pyramid (high to low resolution).")
    if xs[0].shape[1] // xs[1].shape[1] != self.factor:
      raise ValueError(f"the outer UNet ({len(self.outer.channel_mults)} levels) reaches resolution "
                       f"{xs[0].shape[1] // self.factor} but the next level is {xs[1].shape[1]}; use "
                       f"{int(math.log2(xs[0].shape[1] // xs[1].shape[1])) + 1} channel_mults in the outer UNet.")
    b_all = xs[-1].shape[0]
    t = jnp.broadcast_to(jnp.asarray(t), (b_all,))
    b_high = xs[0].shape[0]
    if b_high > b_all:
      raise ValueError(f"the high resolution has {b_high} rows but the lowest only {b_all}.")
    inner_channels = self.inner.outer.base_channels * self.inner.outer.channel_mults[0] \
        if isinstance(self.inner, NestedUNet) else self.inner.base_channels * self.inner.channel_mults[0]
    adapter = NestAdapter(self.inner, inner_channels, self.skip_inner_input, name="adapter")
    outer = self.outer.clone(parent=self, inner=adapter, name="outer_unet")
    cut = lambda v: None if v is None else v[:b_high]  # noqa: E731
    inner_inputs = dict(xs=xs[1:], t=t, class_labels=class_labels, cond=cond, context=context,
                        context_mask=context_mask)
    res = outer(xs[0], t[:b_high], class_labels=cut(class_labels), cond=cut(cond), context=cut(context),
                context_mask=cut(context_mask), inject=inject, inner_inputs=inner_inputs, train=train,
                return_features=return_features)
    if return_features:
      out, features, preds_low = res
      return [out] + preds_low, features
    out, preds_low = res
    return [out] + preds_low


def load_inner(nested_params: Any, inner_params: Any) -> Any:
  """Progressive training: puts a trained lower-resolution network's params into a NestedUNet's params.

  Args:
    nested_params: params of a NestedUNet (a dict with 'outer_unet', 'adapter', 'inner').
    inner_params: params of the standalone inner network (the same UNet / NestedUNet as `NestedUNet.inner`).

  Returns:
    nested_params with params['inner'] replaced (the adapters stay as they are: zero at initialisation, so the
    low-resolution output of the nested model then equals the trained inner model's).
  """
  if not isinstance(nested_params, dict) or "inner" not in nested_params or "outer_unet" not in nested_params:
    raise ValueError("nested_params must be a NestedUNet's params (keys 'outer_unet', 'adapter', 'inner'), got keys "
                     f"{sorted(nested_params) if isinstance(nested_params, dict) else type(nested_params)}.")
  want = jax.tree.map(lambda a: (tuple(a.shape), str(a.dtype)), nested_params["inner"])
  got = jax.tree.map(lambda a: (tuple(np.shape(a)), str(jnp.asarray(a).dtype)), inner_params)
  if jax.tree.structure(want) != jax.tree.structure(got) or jax.tree.leaves(want) != jax.tree.leaves(got):
    flat_w = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(want)[0]}
    flat_g = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_flatten_with_path(got)[0]}
    diff = sorted(set(flat_w.items()) ^ set(flat_g.items()))[:4]
    raise ValueError("inner_params do not match the nested model's inner network (train the low-resolution model "
                     f"with the same config as NestedUNet.inner); first differences: {diff}.")
  return {**nested_params, "inner": inner_params}


# ------------------------------------------------------------------------------------------ builders


def _unet(cfg: Any, **overrides) -> UNet:
  d = dict(cfg)
  for k in ("channel_mults", "attention_levels", "num_res_blocks", "attention_layers"):
    if k in d and not isinstance(d[k], int):
      d[k] = tuple(d[k])
  d.update(overrides)
  return UNet(**d)


def make_model(levels: Sequence[Any], num_classes: int = 0, skip_inner_input: bool = False) -> nn.Module:
  """Builds a UNet (one level) or a NestedUNet from per-level UNet configs, high to low resolution.

  Args:
    levels: L dicts of UNet options (base_channels, channel_mults, num_res_blocks, ...); every level but the
      last is an outer UNet (mid_blocks forced False, as `skip_mid_blocks` in the official run), the last is a
      plain UNet with middle blocks.
    num_classes: class conditioning for every level (0: none).
    skip_inner_input: see NestedUNet.

  Returns:
    the network; `model.num_levels` levels.
  """
  levels = list(levels)
  if not levels:
    raise ValueError("make_model needs at least one level config.")
  model = _unet(levels[-1], num_classes=num_classes)
  for cfg in reversed(levels[:-1]):
    model = NestedUNet(outer=_unet(cfg, num_classes=num_classes, mid_blocks=False), inner=model,
                       skip_inner_input=skip_inner_input)
  return model


def inner_model(model: nn.Module) -> nn.Module:
  """The network one level down (what progressive training trains first)."""
  if not isinstance(model, NestedUNet):
    raise ValueError("only a NestedUNet has an inner network.")
  return model.inner


def num_levels(model: nn.Module) -> int:
  """1 for a UNet, L for a NestedUNet."""
  return model.num_levels if isinstance(model, NestedUNet) else 1


def apply_model(model: nn.Module, params: Any, xs: Sequence[jax.Array], t: jax.Array, **kw) -> list[jax.Array]:
  """Runs a UNet or NestedUNet on a list of levels -> list of predictions (a UNet has one level).

  Args:
    model: a UNet or NestedUNet.
    params: its params.
    xs: L noisy levels [B, H_r, W_r, C], high to low (one for a UNet).
    t: [B] times.
    **kw: passed to the module (class_labels, cond, ...).

  Returns:
    list of L predictions, each of its level's shape.

  Raises:
    ValueError: a plain UNet given more than one level.
  """
  if isinstance(model, NestedUNet):
    return model.apply({"params": params}, list(xs), t, **kw)
  if len(xs) != 1:
    raise ValueError(f"a plain UNet takes one level, got {len(xs)}.")
  return [model.apply({"params": params}, xs[0], t, **kw)]
