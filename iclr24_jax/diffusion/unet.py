"""A configurable UNet (DDPM / ADM style) and an MLP denoiser for vectors, in Flax Linen.

Both share one call signature, so the loss, train step and samplers take either:
  model(x_t, t, *, cond=None, class_labels=None, context=None, context_mask=None, train=False) -> [x_t.shape]
    x_t: [B, H, W, C] (UNet) or [B, ...] flattened to [B, D] (MLPDenoiser); t: [B] float or int time.
    cond: [B, C_cond] vector condition, added to the time embedding (e.g. a state, a degradation embedding).
    class_labels: [B] int in [0, num_classes]; the value num_classes is the "null" label for classifier-free
      guidance.
    context: [B, L, D_ctx] tokens for cross-attention (UNet, at the attention levels), with an optional
      context_mask [B, L] (True = attend).

UNet layout (Ho et al. 2020, App. B; Dhariwal & Nichol 2021): a 3x3 stem conv, then per level
`num_res_blocks` ResBlocks (with self/cross-attention where `level in attention_levels`) and a strided-conv
downsample; a middle ResBlock-Attention-ResBlock; the mirrored up path with skip connections; GroupNorm-SiLU-conv
out (zero-initialised). Nesting (Matryoshka Diffusion, Gu et al. 2024): `inner` is called at the bottleneck as

  inner(h [B, h, w, C_mid], temb [B, E], inner_inputs, *, t, cond, class_labels, context, context_mask, train)
      -> h' [B, h, w, C_mid]   or   (h', aux)

`inner_inputs` is whatever the caller passed to `UNet.__call__(..., inner_inputs=...)` (MDM: the lower-resolution
noisy images), the keywords are the outer call's own inputs (so an inner UNet can embed t and the labels itself).
When the inner returns `(h', aux)` the UNet returns `(out, aux)` (MDM: aux = the low-resolution predictions).
`inject` adds features to the stem output (how an outer network feeds an inner one), `return_features` hands
out the top-level decoder features, and `mid_blocks=False` drops the middle blocks (MDM's outer UNet, whose
bottleneck is the inner network).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def timestep_embedding(t: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
  """Sinusoidal embedding of (float) times t [B] -> [B, dim] (Vaswani et al. 2017; DDPM App. B; ADM ordering).

  emb = [cos(t f_0), ..., cos(t f_{h-1}), sin(t f_0), ..., sin(t f_{h-1})], f_i = max_period^(-i / h), h = dim / 2.

  Args:
    t: times, any shape (flattened to [B]); cast to float32.
    dim: embedding width (even).
    max_period: the lowest frequency's period.

  Returns:
    float32 [B, dim].

  Raises:
    ValueError: dim is odd.
  """
  if dim % 2:
    raise ValueError(f"timestep embedding dim must be even, got {dim}.")
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  args = jnp.asarray(t, jnp.float32).reshape(-1)[:, None] * freqs[None]
  return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


def _groups(channels: int, num_groups: int) -> int:
  return math.gcd(channels, num_groups)


class TimeEmbedding(nn.Module):
  """t [B] -> sinusoidal(t * time_scale) -> Dense(dim) -> SiLU -> Dense(dim)."""

  dim: int
  time_scale: float = 1.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, t):
    h = timestep_embedding(jnp.asarray(t, jnp.float32) * self.time_scale, max(self.dim // 4, 16) * 2)
    h = nn.Dense(self.dim, dtype=self.dtype)(h)
    return nn.Dense(self.dim, dtype=self.dtype)(nn.silu(h))


def _resample(x: jax.Array, resample: str | None) -> jax.Array:
  """2x2 average pooling ('down'), 2x nearest upsampling ('up') or nothing (None): ADM's resampling without conv."""
  b, h, w, c = x.shape
  if resample == "down":
    return x.reshape(b, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))
  if resample == "up":
    return jax.image.resize(x, (b, 2 * h, 2 * w, c), method="nearest")
  if resample is None:
    return x
  raise ValueError(f"unknown resample '{resample}'; choose 'down', 'up' or None.")


class ResBlock(nn.Module):
  """GN-SiLU-conv, + Dense(temb) (or scale/shift), GN-SiLU-dropout-conv(zero init), + skip (1x1 if needed).

  With `resample` ('down' / 'up') the block also halves / doubles the resolution as ADM's
  `ResBlock(down=True / up=True)` (`resblock_updown`): after the first GroupNorm-SiLU both the branch and the
  skip are average-pooled / nearest-upsampled, then the first conv runs at the new resolution.
  """

  out_channels: int
  num_groups: int = 32
  dropout: float = 0.0
  scale_shift: bool = False
  resample: str | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, temb, train: bool = False):
    c = self.out_channels
    h = nn.silu(nn.GroupNorm(_groups(x.shape[-1], self.num_groups), dtype=self.dtype)(x))
    if self.resample is not None:
      h, x = _resample(h, self.resample), _resample(x, self.resample)
    h = nn.Conv(c, (3, 3), padding="SAME", dtype=self.dtype)(h)
    t = nn.Dense(2 * c if self.scale_shift else c, dtype=self.dtype)(nn.silu(temb))[:, None, None, :]
    h = nn.GroupNorm(_groups(c, self.num_groups), dtype=self.dtype)(h)
    if self.scale_shift:  # ADM's "use_scale_shift_norm": GN(h) * (1 + scale) + shift
      scale, shift = jnp.split(t, 2, axis=-1)
      h = h * (1.0 + scale) + shift
    else:  # DDPM: add the projected time embedding
      h = h + t
    h = nn.silu(h)
    h = nn.Dropout(self.dropout, deterministic=not train)(h)
    h = nn.Conv(c, (3, 3), padding="SAME", kernel_init=nn.initializers.zeros, dtype=self.dtype)(h)
    if x.shape[-1] != c:
      x = nn.Conv(c, (1, 1), dtype=self.dtype)(x)
    return x + h


class AttentionBlock(nn.Module):
  """Self-attention over the H*W positions, then (if context is given) cross-attention to context tokens.

  Each is pre-normed (GroupNorm / LayerNorm) and residual with a zero-initialised output projection. With `ffn`
  a residual feed-forward layer follows (MDM's `use_attention_ffn`, official unet.py SelfAttention.ffn):
  GroupNorm -> 1x1 conv to 4 C -> GELU -> zero-initialised 1x1 conv back to C.
  """

  num_heads: int = 4
  num_groups: int = 32
  ffn: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, context=None, context_mask=None):
    b, hh, ww, c = x.shape
    if c % self.num_heads:
      raise ValueError(f"attention channels {c} are not divisible by num_heads={self.num_heads}.")
    h = nn.GroupNorm(_groups(c, self.num_groups), dtype=self.dtype)(x).reshape(b, hh * ww, c)
    h = nn.MultiHeadDotProductAttention(self.num_heads, dtype=self.dtype, out_kernel_init=nn.initializers.zeros,
                                        name="self_attn")(h, h)
    x = x + h.reshape(b, hh, ww, c)
    if context is not None:
      q = nn.LayerNorm(dtype=self.dtype)(x.reshape(b, hh * ww, c))
      mask = None
      if context_mask is not None:
        mask = nn.make_attention_mask(jnp.ones((b, hh * ww), bool), context_mask.astype(bool))
      h = nn.MultiHeadDotProductAttention(self.num_heads, dtype=self.dtype, out_kernel_init=nn.initializers.zeros,
                                          name="cross_attn")(q, context, mask=mask)
      x = x + h.reshape(b, hh, ww, c)
    if self.ffn:
      h = nn.GroupNorm(_groups(c, self.num_groups), dtype=self.dtype, name="ffn_norm")(x)
      h = nn.gelu(nn.Dense(4 * c, dtype=self.dtype, name="ffn_in")(h), approximate=False)
      x = x + nn.Dense(c, kernel_init=nn.initializers.zeros, dtype=self.dtype, name="ffn_out")(h)
    return x


class Downsample(nn.Module):
  channels: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    return nn.Conv(self.channels, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), dtype=self.dtype)(x)


class Upsample(nn.Module):
  channels: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    b, h, w, c = x.shape
    x = jax.image.resize(x, (b, 2 * h, 2 * w, c), method="nearest")
    return nn.Conv(self.channels, (3, 3), padding="SAME", dtype=self.dtype)(x)


def per_level(value: int | Sequence[int], levels: int, name: str) -> tuple[int, ...]:
  """An int for every level, or one int per level, as a tuple of `levels` non-negative ints.

  Args:
    value: int or sequence of ints.
    levels: number of UNet levels (len(channel_mults)).
    name: the option's name (for the error).

  Returns:
    tuple of `levels` ints.

  Raises:
    ValueError: a sequence of the wrong length, or a negative count.
  """
  counts = (int(value),) * levels if isinstance(value, int) else tuple(int(v) for v in value)
  if len(counts) != levels or min(counts) < 0:
    raise ValueError(f"{name}={value!r}: give one non-negative count, or one per level ({levels} levels).")
  return counts


def _condition_embedding(temb, dim, num_classes, class_labels, cond, dtype):
  """Adds class-label and vector-condition embeddings to the time embedding."""
  if num_classes:
    if class_labels is None:
      raise ValueError(f"this model was built with num_classes={num_classes}: pass class_labels [B] "
                       f"(use {num_classes} for the null label).")
    temb = temb + nn.Embed(num_classes + 1, dim, name="class_embed")(class_labels)
  elif class_labels is not None:
    raise ValueError("class_labels were given but the model has num_classes=0; set model.num_classes.")
  if cond is not None:
    c = nn.Dense(dim, dtype=dtype, name="cond_embed_0")(cond.reshape(cond.shape[0], -1))
    temb = temb + nn.Dense(dim, dtype=dtype, name="cond_embed_1")(nn.silu(c))
  return temb


class UNet(nn.Module):
  """A configurable denoising UNet.

  Attributes:
    base_channels: C, channels of level 0.
    channel_mults: channels of level i are C * channel_mults[i]; len = number of levels (each but the last
      halves the resolution, so H and W must be divisible by 2 ** (levels - 1)).
    num_res_blocks: ResBlocks per level on the way down (one more on the way up, as in DDPM); an int for every
      level or one count per level (MDM's `num_resnets_per_resolution`, e.g. (2, 2, 1)).
    attention_levels: level indices with attention after each ResBlock (DDPM: the 16x16 level).
    attention_layers: attention blocks after each ResBlock at an attention level: an int or one count per level
      (MDM's `num_attention_layers`, e.g. (0, 1, 5)); the middle block keeps one.
    attention_ffn: a feed-forward layer after every attention block (MDM's `use_attention_ffn`).
    resblock_updown: resample with ResBlocks (ADM's `resblock_updown`: average pooling / nearest upsampling
      inside a ResBlock) instead of a strided / upsampling conv.
    mid_attention: attention in the middle block.
    num_heads: attention heads.
    out_channels: output channels (default: the input's).
    time_embed_dim: width of the time embedding (default 4 C).
    time_scale: multiplies t before the sinusoidal embedding (1000 for continuous t in [0, 1]).
    num_classes: > 0 adds a class embedding (labels in [0, num_classes], num_classes = null).
    dropout: in ResBlocks (needs a 'dropout' rng when train=True).
    num_groups: GroupNorm groups (the gcd with the channel count is used).
    scale_shift: ADM's scale/shift time conditioning instead of DDPM's addition.
    mid_blocks: the middle ResBlock-(Attention)-ResBlock (MDM's outer UNet has none: skip_mid_blocks).
    inner: optional module called at the bottleneck (nesting; see module docstring).
    dtype: computation dtype (params stay float32).
  """

  base_channels: int = 64
  channel_mults: Sequence[int] = (1, 2, 2)
  num_res_blocks: int | Sequence[int] = 2
  attention_levels: Sequence[int] = (1,)
  attention_layers: int | Sequence[int] = 1
  attention_ffn: bool = False
  resblock_updown: bool = False
  mid_attention: bool = True
  num_heads: int = 4
  out_channels: int | None = None
  time_embed_dim: int | None = None
  time_scale: float = 1.0
  num_classes: int = 0
  dropout: float = 0.0
  num_groups: int = 32
  scale_shift: bool = False
  mid_blocks: bool = True
  inner: nn.Module | None = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, t, *, cond=None, class_labels=None, context=None, context_mask=None, inject=None,
               inner_inputs=None, train: bool = False, return_features: bool = False):
    """Predicts eps / x0 / v [B, H, W, out_channels] from x_t [B, H, W, C_in] and t [B] (see module docstring).

    Args:
      inject: optional features [B, H, W, C * channel_mults[0]] added to the stem output (nesting).
      inner_inputs: extra inputs handed to the `inner` module (any pytree; nesting). Needs `inner`.
      return_features: also return the last decoder features [B, H, W, C * channel_mults[0]].

    Returns:
      out [B, H, W, out_channels]; `(out, features)` with return_features; `(out, aux)` when the inner module
      returns `(h, aux)`; `(out, features, aux)` with both.
    """
    if inner_inputs is not None and self.inner is None:
      raise ValueError("inner_inputs were given but this UNet has no inner module; build it with UNet(inner=...).")
    if x.ndim != 4:
      raise ValueError(f"UNet input must be [B, H, W, C], got shape {x.shape}.")
    levels = len(self.channel_mults)
    factor = 2 ** (levels - 1)
    if x.shape[1] % factor or x.shape[2] % factor:
      raise ValueError(f"UNet with {levels} levels needs H and W divisible by {factor}, got {x.shape[1:3]}; "
                       "use fewer channel_mults or pad the images.")
    bad = [lvl for lvl in self.attention_levels if not 0 <= lvl < levels]
    if bad:
      raise ValueError(f"attention_levels {bad} are outside the {levels} levels (0..{levels - 1}).")
    res_blocks = per_level(self.num_res_blocks, levels, "num_res_blocks")
    attn_layers = per_level(self.attention_layers, levels, "attention_layers")
    t = jnp.broadcast_to(jnp.asarray(t, jnp.float32), (x.shape[0],))
    c0 = self.base_channels
    emb_dim = self.time_embed_dim or 4 * c0
    temb = TimeEmbedding(emb_dim, self.time_scale, self.dtype, name="time_embed")(t)
    temb = _condition_embedding(temb, emb_dim, self.num_classes, class_labels, cond, self.dtype)
    block_kw = dict(num_groups=self.num_groups, dropout=self.dropout, scale_shift=self.scale_shift, dtype=self.dtype)
    attn_kw = dict(num_heads=self.num_heads, num_groups=self.num_groups, ffn=self.attention_ffn, dtype=self.dtype)

    def attention(h, where: str, level: int, i: int):
      # The first block of a position keeps the name it had before `attention_layers` existed.
      for j in range(attn_layers[level] if level in self.attention_levels else 0):
        name = f"{where}_{level}_attn_{i}" + (f"_{j}" if j else "")
        h = AttentionBlock(name=name, **attn_kw)(h, context, context_mask)
      return h

    h = nn.Conv(c0 * self.channel_mults[0], (3, 3), padding="SAME", dtype=self.dtype, name="stem")(x)
    if inject is not None:
      h = h + inject
    skips = [h]
    for level, mult in enumerate(self.channel_mults):                       # down path
      for i in range(res_blocks[level]):
        h = ResBlock(c0 * mult, name=f"down_{level}_res_{i}", **block_kw)(h, temb, train)
        h = attention(h, "down", level, i)
        skips.append(h)
      if level != levels - 1:
        if self.resblock_updown:
          h = ResBlock(h.shape[-1], resample="down", name=f"down_{level}_downsample", **block_kw)(h, temb, train)
        else:
          h = Downsample(h.shape[-1], self.dtype, name=f"down_{level}_downsample")(h)
        skips.append(h)

    c_mid = h.shape[-1]                                                      # middle
    if self.mid_blocks:
      h = ResBlock(c_mid, name="mid_res_0", **block_kw)(h, temb, train)
      if self.mid_attention:
        h = AttentionBlock(name="mid_attn", **attn_kw)(h, context, context_mask)
      h = ResBlock(c_mid, name="mid_res_1", **block_kw)(h, temb, train)
    aux = None
    if self.inner is not None:                                               # nesting hook (MDM)
      res = self.inner(h, temb, inner_inputs, t=t, cond=cond, class_labels=class_labels, context=context,
                       context_mask=context_mask, train=train)
      h, aux = res if isinstance(res, tuple) else (res, None)
      if h.shape[:-1] != skips[-1].shape[:-1] or h.shape[-1] != c_mid:
        raise ValueError(f"the inner module returned features of shape {h.shape}; it must keep the bottleneck's "
                         f"shape {skips[-1].shape[:-1] + (c_mid,)}.")

    for level, mult in reversed(list(enumerate(self.channel_mults))):       # up path
      for i in range(res_blocks[level] + 1):
        h = jnp.concatenate([h, skips.pop()], axis=-1)
        h = ResBlock(c0 * mult, name=f"up_{level}_res_{i}", **block_kw)(h, temb, train)
        h = attention(h, "up", level, i)
      if level != 0:
        if self.resblock_updown:
          h = ResBlock(h.shape[-1], resample="up", name=f"up_{level}_upsample", **block_kw)(h, temb, train)
        else:
          h = Upsample(h.shape[-1], self.dtype, name=f"up_{level}_upsample")(h)
    features = h
    h = nn.silu(nn.GroupNorm(_groups(h.shape[-1], self.num_groups), dtype=self.dtype, name="out_norm")(h))
    out = nn.Conv(self.out_channels or x.shape[-1], (3, 3), padding="SAME", kernel_init=nn.initializers.zeros,
                  dtype=self.dtype, name="out_conv")(h).astype(jnp.float32)
    outs = (out,) + ((features,) if return_features else ()) + ((aux,) if aux is not None else ())
    return outs[0] if len(outs) == 1 else outs


class MLPDenoiser(nn.Module):
  """A residual MLP denoiser for vectors (latents, actions, skills), conditioned on time and an optional state.

  x [B, ...] is flattened to [B, D]; each block is h += Dense(SiLU(LN(h) W + emb_proj)) with emb = time
  embedding (+ condition embedding). Output has x's shape.

  Attributes:
    hidden: width of the residual stream.
    num_blocks: residual blocks.
    time_embed_dim: width of the time (and condition) embedding.
    time_scale: multiplies t before the sinusoidal embedding (1000 for continuous t).
    num_classes: optional class embedding (labels in [0, num_classes], num_classes = null).
    dropout: inside the blocks (needs a 'dropout' rng when train=True).
  """

  hidden: int = 256
  num_blocks: int = 3
  time_embed_dim: int = 128
  time_scale: float = 1.0
  num_classes: int = 0
  dropout: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, t, *, cond=None, class_labels=None, context=None, context_mask=None, train: bool = False):
    if context is not None or context_mask is not None:
      raise ValueError("MLPDenoiser takes no cross-attention context; pass a vector condition as cond=[B, C].")
    shape = x.shape
    h = x.reshape(shape[0], -1)
    t = jnp.broadcast_to(jnp.asarray(t, jnp.float32), (shape[0],))
    emb = TimeEmbedding(self.time_embed_dim, self.time_scale, self.dtype, name="time_embed")(t)
    emb = _condition_embedding(emb, self.time_embed_dim, self.num_classes, class_labels, cond, self.dtype)
    h = nn.Dense(self.hidden, dtype=self.dtype, name="in_proj")(h)
    for i in range(self.num_blocks):
      r = nn.LayerNorm(dtype=self.dtype)(h)
      r = nn.Dense(self.hidden, dtype=self.dtype)(r) + nn.Dense(self.hidden, dtype=self.dtype)(nn.silu(emb))
      r = nn.Dropout(self.dropout, deterministic=not train)(nn.silu(r))
      h = h + nn.Dense(self.hidden, dtype=self.dtype, name=f"block_{i}_out")(r)
    h = nn.silu(nn.LayerNorm(dtype=self.dtype)(h))
    out = nn.Dense(math.prod(shape[1:]), kernel_init=nn.initializers.zeros, dtype=self.dtype, name="out_proj")(h)
    return out.reshape(shape).astype(jnp.float32)


def unet_flops(model: UNet, height: int, width: int, in_channels: int, context_len: int = 0,
               context_dim: int = 0) -> float:
  """Matmul / convolution FLOPs of one UNet forward pass on one example, counted by hand from the architecture.

  A k x k convolution from C_in to C_out with an H' x W' output costs 2 H' W' k^2 C_in C_out; a Dense layer
  2 x inputs x outputs per position; self-attention over N = H W positions of width C: q, k, v and output
  projections 8 N C^2 plus scores and mixing 4 N^2 C; cross-attention to L tokens of width D: 4 N C^2 + 4 L D C +
  4 N L C; the attention feed-forward layer 16 N C^2. Normalisation, activations and the `inner` module (nesting)
  are not counted.

  Args:
    model: the UNet (its `inner` is ignored: count a nested network's parts separately).
    height, width: the input's H and W.
    in_channels: the input's C.
    context_len, context_dim: cross-attention tokens L and their width D (0: no context).

  Returns:
    FLOPs (float) of one forward pass of one example.
  """
  levels = len(model.channel_mults)
  res_blocks = per_level(model.num_res_blocks, levels, "num_res_blocks")
  attn_layers = per_level(model.attention_layers, levels, "attention_layers")
  c0 = model.base_channels
  emb = model.time_embed_dim or 4 * c0
  conv = lambda hw, k, cin, cout: 2.0 * hw * k * k * cin * cout  # noqa: E731

  def res(hw, cin, c, resample=None):
    hw_out = hw // 4 if resample == "down" else hw * 4 if resample == "up" else hw
    f = conv(hw_out, 3, cin, c) + conv(hw_out, 3, c, c) + 2.0 * emb * c * (2 if model.scale_shift else 1)
    return f + (conv(hw_out, 1, cin, c) if cin != c else 0.0)

  def attn(hw, c):
    f = 8.0 * hw * c * c + 4.0 * hw * hw * c
    if context_len:
      f += 4.0 * hw * c * c + 4.0 * context_len * context_dim * c + 4.0 * hw * context_len * c
    return f + (16.0 * hw * c * c if model.attention_ffn else 0.0)

  sin_dim = max(emb // 4, 16) * 2
  total = 2.0 * (sin_dim * emb + emb * emb)                                    # time embedding
  hw, ch = height * width, c0 * model.channel_mults[0]
  total += conv(hw, 3, in_channels, ch)                                        # stem
  skips = [ch]
  for level, mult in enumerate(model.channel_mults):
    for _ in range(res_blocks[level]):
      total += res(hw, ch, c0 * mult)
      ch = c0 * mult
      if level in model.attention_levels:
        total += attn_layers[level] * attn(hw, ch)
      skips.append(ch)
    if level != levels - 1:
      total += res(hw, ch, ch, "down") if model.resblock_updown else conv(hw // 4, 3, ch, ch)
      hw //= 4
      skips.append(ch)
  if model.mid_blocks:
    total += 2 * res(hw, ch, ch) + (attn(hw, ch) if model.mid_attention else 0.0)
  for level, mult in reversed(list(enumerate(model.channel_mults))):
    for _ in range(res_blocks[level] + 1):
      total += res(hw, ch + skips.pop(), c0 * mult)
      ch = c0 * mult
      if level in model.attention_levels:
        total += attn_layers[level] * attn(hw, ch)
    if level != 0:
      total += res(hw, ch, ch, "up") if model.resblock_updown else conv(hw * 4, 3, ch, ch)
      hw *= 4
  return total + conv(hw, 3, ch, model.out_channels or in_channels)            # output conv


def create_model(model_config: Any) -> nn.Module:
  """Builds a denoiser from `config.model` (name 'unet' or 'mlp'; the other fields are the module's attributes)."""
  cfg = dict(model_config)
  name = cfg.pop("name", "unet")
  if name == "unet":
    for k in ("channel_mults", "attention_levels", "num_res_blocks", "attention_layers"):
      if k in cfg and not isinstance(cfg[k], int):
        cfg[k] = tuple(cfg[k])
    cls = UNet
  elif name == "mlp":
    cls = MLPDenoiser
  else:
    raise ValueError(f"unknown diffusion model '{name}'; choose 'unet' or 'mlp'.")
  fields = {f.name for f in dataclasses.fields(cls)} - {"parent", "name"}
  unknown = set(cfg) - fields
  if unknown:
    raise ValueError(f"unknown {name} model options {sorted(unknown)}; valid: {sorted(fields)}.")
  return cls(**cfg)
