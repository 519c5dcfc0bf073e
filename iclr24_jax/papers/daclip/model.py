"""DA-CLIP: a frozen CLIP image encoder steered by a trainable controller (a weight copy of the encoder), and
the restoration network conditioned on its two embeddings.

  e_d, (h_1..h_L) = controller(image)                      # the copy, run with return_hidden=True
  c_i = Z_i h_i                                            # zero-initialised Linear(width, width) per block
  e_c = encoder(image, controls = (c_L, ..., c_1))         # frozen; the controls in reversed order, as the
                                                           # official ControlTransformer pops them
  loss = InfoNCE(e_c, text(clean caption)) + InfoNCE(e_d, text(degradation name))      (Eq. 1-2)

Only the controller (its ViT copy, the zero projections) and DA-CLIP's own logit scale train; the frozen
encoder and the text tower keep their stage-0 CLIP weights. With the projections at zero, e_c is exactly
the frozen encoder's output (tests/papers/test_daclip.py).

The restoration network is `diffusion.UNet`: input concat(x_t - mu, mu) (official ConditionalUNet:
`x = xt - cond; cat([x, cond])`), e_d through `cond` (added to the time embedding), e_c through cross-attention
`context` [B, 1, D] at the attention levels; it predicts the noise of x_t.
# Deviation: no prompt module (official: softmax(MLP(e_d)) * learned prompt -> MLP, added to the time
# embedding); here e_d enters the UNet's `cond` path (Dense-SiLU-Dense added to the time embedding).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.diffusion import unet as unet_lib
from iclr24_jax.papers.daclip import irsde
from iclr24_jax.vision import clip

__all__ = ["DaClip", "daclip_from_clip", "init_daclip_params", "controller_loss", "make_controller_optimizer",
           "make_controller_train_step", "degradation_logits", "create_restorer", "predict_noise", "restoration_loss",
           "make_restoration_train_step", "trainable_mask", "restore", "noise_fn_for", "heldout_matching_loss"]


class DaClip(nn.Module):
  """Frozen ViT image encoder + controller copy with zero-initialised per-block projections.

  Attributes:
    embed_dim, patch_size, width, depth, heads, pool: the CLIP image tower's `vision.clip.ViT` settings.
    logit_scale_init: initial stored log scale (copied from the CLIP model by `init_daclip_params`).
    reverse_controls: add the controller's block i control after frozen block L-1-i (official order); False
      adds it after block i.
  """

  embed_dim: int = 64
  patch_size: int = 4
  width: int = 64
  depth: int = 4
  heads: int = 4
  pool: str = "cls"
  logit_scale_init: float = clip.LOGIT_SCALE_INIT
  reverse_controls: bool = True

  def setup(self):
    kw = dict(num_classes=self.embed_dim, patch_size=self.patch_size, width=self.width, depth=self.depth,
              heads=self.heads, pool=self.pool)
    self.encoder = clip.ViT(**kw)        # frozen (params['encoder'] = the CLIP image tower's params)
    self.controller = clip.ViT(**kw)     # the trainable copy
    self.control_proj = [nn.Dense(self.width, kernel_init=nn.initializers.zeros, bias_init=nn.initializers.zeros)
                         for _ in range(self.depth)]
    self.logit_scale = self.param("logit_scale", nn.initializers.constant(self.logit_scale_init), ())

  def __call__(self, images: jax.Array) -> tuple[jax.Array, jax.Array]:
    """images [B, H, W, C] -> (e_c content embedding [B, D], e_d degradation embedding [B, D]), not normalised
    (the official restoration model takes them unnormalised)."""
    e_d, hidden = self.controller(images, return_hidden=True)
    controls = [proj(h) for proj, h in zip(self.control_proj, hidden)]
    if self.reverse_controls:
      controls = controls[::-1]                 # official: `x += control.pop()` after each frozen block
    e_c = self.encoder(images, controls=controls)
    return e_c, e_d

  def encode_frozen(self, images: jax.Array) -> jax.Array:
    """The frozen encoder alone (plain CLIP image embedding) [B, D], not normalised."""
    return self.encoder(images)


def daclip_from_clip(clip_model: clip.CLIP, reverse_controls: bool = True) -> DaClip:
  """A DaClip whose encoder / controller have the settings of `clip_model.image_encoder` (a `clip.ViT`).

  Args:
    clip_model: a vision.clip.CLIP with a ViT image tower.
    reverse_controls: the DaClip's reverse_controls flag (controller outputs added to the encoder blocks in
      reverse order).

  Returns:
    DaClip with the ViT's embed_dim, patch_size, width, depth, heads and pool.

  Raises:
    ValueError: the image tower is not a clip.ViT.
  """
  vit = clip_model.image_encoder
  if not isinstance(vit, clip.ViT):
    raise ValueError(f"DA-CLIP controls a ViT image tower; this CLIP has {type(vit).__name__}. Build the CLIP "
                     "with model.image.name='vit'.")
  return DaClip(embed_dim=vit.num_classes, patch_size=vit.patch_size, width=vit.width, depth=vit.depth,
                heads=vit.heads, pool=vit.pool, reverse_controls=reverse_controls)


def init_daclip_params(model: DaClip, clip_params: Any, image_shape: tuple[int, ...]) -> dict:
  """DA-CLIP params from a trained CLIP: encoder and controller both = the CLIP image tower, zero projections,
  logit scale copied (the official `initial_controller`).

  Args:
    model: a DaClip with the CLIP image tower's settings.
    clip_params: params of `vision.clip.CLIP` (keys image_encoder, text_encoder, logit_scale).
    image_shape: one image's shape (H, W, C).

  Returns:
    dict encoder, controller, control_proj_0..L-1, logit_scale.
  """
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1,) + tuple(image_shape))))["params"]
  image = clip_params["image_encoder"]
  want = jax.tree_util.tree_structure(shapes["encoder"])
  if jax.tree_util.tree_structure(image) != want:
    raise ValueError("the CLIP image tower's parameters do not match the DaClip encoder; build DaClip with "
                     "daclip_from_clip(clip_model) so the ViT settings agree.")
  params = {"encoder": image, "controller": jax.tree_util.tree_map(jnp.array, image),
            "logit_scale": jnp.asarray(clip_params["logit_scale"])}
  for i in range(model.depth):
    p = shapes[f"control_proj_{i}"]
    params[f"control_proj_{i}"] = {"kernel": jnp.zeros(p["kernel"].shape), "bias": jnp.zeros(p["bias"].shape)}
  return params


def trainable_mask(params: dict) -> dict:
  """'train' for the controller, the zero projections and the logit scale; 'frozen' for the encoder."""
  return {k: jax.tree_util.tree_map(lambda _: "frozen" if k == "encoder" else "train", v) for k, v in params.items()}


def controller_loss(params: dict, model: DaClip, batch: dict) -> tuple[jax.Array, dict]:
  """DA-CLIP's loss (official DaClipLoss): CLIP InfoNCE on (e_c, caption) plus InfoNCE on (e_d, degradation).

  Args:
    params: DaClip params (the encoder is held fixed with stop_gradient).
    model: the DaClip module.
    batch: image [B, H, W, C] degraded images; caption_emb [B, D] unit-norm frozen text embeddings of the
      clean captions; degradation_emb [B, D] unit-norm frozen text embeddings of the degradation names.

  Returns:
    (loss, metrics dict: loss, content_loss, degradation_loss, logit_scale).
  """
  for k in ("image", "caption_emb", "degradation_emb"):
    if k not in batch:
      raise KeyError(f"controller_loss needs batch['{k}'] (image [B, H, W, C], caption_emb and degradation_emb "
                     "[B, D] from the frozen text tower).")
  params = {**params, "encoder": jax.lax.stop_gradient(params["encoder"])}
  e_c, e_d = model.apply({"params": params}, batch["image"])
  scale = jnp.exp(params["logit_scale"])
  content = clip.clip_loss(clip.l2_normalize(e_c), batch["caption_emb"], scale)          # Eq. (1)
  degradation = clip.clip_loss(clip.l2_normalize(e_d), batch["degradation_emb"], scale)  # Eq. (2)
  loss = content + degradation
  return loss, {"loss": loss, "content_loss": content, "degradation_loss": degradation, "logit_scale": scale}


def make_controller_optimizer(opt_config: Any, num_steps: int, params: dict) -> optax.GradientTransformation:
  """AdamW as CLIP (`vision.clip.make_optimizer`) on the trainable parts; the frozen encoder gets no updates.

  Args:
    opt_config: the optimizer ConfigDict (see `vision.clip.make_optimizer`).
    num_steps: total training steps (for the schedule).
    params: DaClip params (their top-level keys define the trainable / frozen labels).

  Returns:
    optax.GradientTransformation (multi_transform: 'train' AdamW, 'frozen' zero updates).
  """
  return optax.multi_transform({"train": clip.make_optimizer(opt_config, num_steps), "frozen": optax.set_to_zero()},
                               trainable_mask(params))


def make_controller_train_step(model: DaClip) -> Callable:
  """Pure `train_step(state, batch, key) -> (state, metrics)` of the controller (logit scale clamped after)."""

  def train_step(state: TrainState, batch: dict, key: jax.Array):
    del key
    (_, metrics), grads = jax.value_and_grad(controller_loss, has_aux=True)(state.params, model, batch)
    state = state.apply_gradients(grads)
    return state.replace(params=clip.clamp_logit_scale(state.params)), metrics

  return train_step


def degradation_logits(e_d: jax.Array, name_emb: jax.Array) -> jax.Array:
  """Cosine similarities [N, K] of degradation embeddings [N, D] to the K degradation-name embeddings [K, D]
  (zero-shot degradation classification: argmax over K).

  Args:
    e_d: [N, D] degradation embeddings (normalised here).
    name_emb: [K, D] text embeddings of the degradation names (normalised here).

  Returns:
    [N, K] cosine similarities in [-1, 1].
  """
  return clip.l2_normalize(e_d) @ clip.l2_normalize(name_emb).T


# ----------------------------------------------------------------------------------------------------------------
# Restoration network and its IR-SDE training
# ----------------------------------------------------------------------------------------------------------------


def create_restorer(model_config: Any) -> unet_lib.UNet:
  """The noise network (diffusion.UNet) from `config.restorer` (UNet fields; out_channels = image channels)."""
  cfg = dict(model_config)
  cfg.setdefault("name", "unet")
  if cfg["name"] != "unet":
    raise ValueError("the DA-CLIP restorer is a diffusion.UNet; set restorer.name='unet'.")
  return unet_lib.create_model(cfg)


def predict_noise(model: nn.Module, params: Any, x_t: jax.Array, mu: jax.Array, t: jax.Array,
                  e_c: jax.Array | None = None, e_d: jax.Array | None = None) -> jax.Array:
  """Predicted noise [B, H, W, C] of x_t given mu [B, H, W, C], t [B], e_c / e_d [B, D] (or None).

  The input is concat(x_t - mu, mu) (official ConditionalUNet), e_d goes to `cond`, e_c to `context` [B, 1, D].

  Args:
    model: the restorer UNet (its input is [B, H, W, 2 C]).
    params: its params.
    x_t: [B, H, W, C] IR-SDE states.
    mu: [B, H, W, C] degraded images in [0, 1].
    t: [B] int times in 1..T.
    e_c: [B, D] content embeddings, or None.
    e_d: [B, D] degradation embeddings, or None.

  Returns:
    [B, H, W, C] predicted noise.
  """
  x = jnp.concatenate([x_t - mu, mu], axis=-1)
  context = None if e_c is None else e_c[:, None, :]
  return model.apply({"params": params}, x, t, cond=e_d, context=context)


def restoration_loss(params: Any, model: nn.Module, batch: dict, key: jax.Array,
                     schedule: irsde.IRSDESchedule) -> tuple[jax.Array, dict]:
  """IR-SDE matching loss of a batch {gt, lq [B, H, W, C], optional e_c, e_d [B, D]} at uniform t in 1..T.

  Args:
    params: restorer params (differentiated).
    model: the restorer UNet.
    batch: {'gt': clean [B, H, W, C], 'lq': degraded [B, H, W, C], in [0, 1]; optional 'e_c', 'e_d' [B, D]}.
    key: PRNG key (times and forward noise).
    schedule: IRSDESchedule.

  Returns:
    (scalar loss, {'loss': loss}).
  """
  key_t, key_x = jax.random.split(key)
  gt, lq = batch["gt"], batch["lq"]
  t = jax.random.randint(key_t, (gt.shape[0],), 1, schedule.num_steps + 1)
  x_t = irsde.irsde_forward_sample(key_x, gt, lq, t, schedule)
  noise = predict_noise(model, params, x_t, lq, t, batch.get("e_c"), batch.get("e_d"))
  loss = irsde.matching_loss(noise, x_t, gt, lq, t, schedule)
  return loss, {"loss": loss}


def heldout_matching_loss(params: Any, model: nn.Module, batch: dict, times: jax.Array, noise: jax.Array,
                          schedule: irsde.IRSDESchedule) -> jax.Array:
  """Per-image IR-SDE matching loss on fixed draws: the training objective evaluated on held-out images.

  Image i is scored at its R times times[i] with the forward noise noise[i] (x_t = m_t + sqrt(v_t) noise); every
  model evaluated with the same draws sees the same x_t, so differences between models (conditions) are paired
  draw by draw. The R draws run one after another (`lax.map`), each a forward pass over the B images.

  Args:
    params: restorer params.
    model: the restorer UNet.
    batch: {'gt', 'lq' [B, H, W, C]; optional 'e_c', 'e_d' [B, D]} as in `restoration_loss`.
    times: [B, R] int times in 1..T.
    noise: [B, R, H, W, C] standard-normal forward noise.
    schedule: IRSDESchedule.

  Returns:
    [B] mean L1 matching loss of each image over its R draws.

  Raises:
    ValueError: times / noise shapes that do not match the batch.
  """
  gt, lq = batch["gt"], batch["lq"]
  if times.ndim != 2 or times.shape[0] != gt.shape[0] or noise.shape != times.shape + gt.shape[1:]:
    raise ValueError(f"times must be [B, R] and noise [B, R, H, W, C] for images {gt.shape}; got times "
                     f"{times.shape}, noise {noise.shape}.")

  def one_draw(tz):
    t, z = tz
    std = irsde.irsde_std(t, schedule).reshape((-1,) + (1,) * (gt.ndim - 1))
    x_t = irsde.irsde_mean(gt, lq, t, schedule) + std * z                       # Eq. (5), as irsde_forward_sample
    pred = predict_noise(model, params, x_t, lq, t, batch.get("e_c"), batch.get("e_d"))
    return irsde.matching_loss_per_example(pred, x_t, gt, lq, t, schedule)

  losses = jax.lax.map(one_draw, (jnp.swapaxes(times, 0, 1), jnp.swapaxes(noise, 0, 1)))   # [R, B]
  return jnp.mean(losses, axis=0)


def make_restoration_train_step(model: nn.Module, schedule: irsde.IRSDESchedule) -> Callable:
  """Pure `train_step(state, batch, key) -> (state, metrics)` for the restorer (key folded with the step).

  Args:
    model: the restorer UNet.
    schedule: IRSDESchedule.

  Returns:
    train_step(state, batch as in `restoration_loss`, key) -> (TrainState, {'loss'}).
  """

  def train_step(state: TrainState, batch: dict, key: jax.Array):
    key = jax.random.fold_in(key, state.step)
    (_, metrics), grads = jax.value_and_grad(restoration_loss, has_aux=True)(state.params, model, batch, key,
                                                                             schedule)
    return state.apply_gradients(grads), metrics

  return train_step


@functools.lru_cache(maxsize=16)   # one function object per model: jitted samplers reuse it
def noise_fn_for(model: nn.Module) -> Callable:
  """noise_fn(params, x_t, mu, t, e_c=None, e_d=None) for `irsde.reverse_sample` with this restorer."""
  return lambda params, x_t, mu, t, e_c=None, e_d=None: predict_noise(model, params, x_t, mu, t, e_c, e_d)


def restore(key: jax.Array, params: Any, lq_image: jax.Array, *, model: nn.Module, schedule: irsde.IRSDESchedule,
            e_c: jax.Array | None = None, e_d: jax.Array | None = None, method: str = "posterior",
            num_samples: int = 1) -> jax.Array:
  """Restores degraded images with the trained restorer: the reverse IR-SDE from x_T = mu + lambda z.

  num_samples > 1 returns the mean of that many independent chains (`irsde.reverse_sample_mean`), an estimate of
  the posterior mean; 1 returns one sample, as the official test script does.

  Args:
    key: PRNG key.
    params: restorer (UNet) params.
    lq_image: degraded images [B, H, W, C] in [0, 1] (mu).
    model: the restorer module (`create_restorer`).
    schedule: `irsde.irsde_schedule(...)`.
    e_c: content embeddings [B, D] from DaClip (or None for a restorer trained without them).
    e_d: degradation embeddings [B, D] from DaClip (or None).
    method: 'posterior' (official test / validation sampler) or 'sde' (reverse-SDE Euler-Maruyama).
    num_samples: chains averaged (1: one posterior sample).

  Returns:
    restored images [B, H, W, C] (unclipped; clip to [0, 1] before scoring).
  """
  lq_image = jnp.asarray(lq_image, jnp.float32)
  if lq_image.ndim != 4:
    raise ValueError(f"restore expects degraded images [B, H, W, C], got shape {lq_image.shape}.")
  for name, e in (("e_c", e_c), ("e_d", e_d)):
    if e is not None and (e.ndim != 2 or e.shape[0] != lq_image.shape[0]):
      raise ValueError(f"{name} must be [B, D] with B = {lq_image.shape[0]}, got {e.shape}.")
  if int(num_samples) == 1:
    return irsde.reverse_sample(key, params, lq_image, noise_fn=noise_fn_for(model), schedule=schedule,
                                method=method, e_c=e_c, e_d=e_d)
  return irsde.reverse_sample_mean(key, params, lq_image, noise_fn=noise_fn_for(model), schedule=schedule,
                                   num_samples=int(num_samples), method=method, e_c=e_c, e_d=e_d)
