"""The denoising training loss (eps / x0 / v targets, optional min-SNR weighting), a train step for
`common.loop.train_loop`, and the glue that turns a trained network into a sampler's denoiser.

Loss (DDPM Algorithm 1 / Eq. 14, "L_simple", generalised to other targets):
  t ~ U(times), eps ~ N(0, I), x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps
  L = E_t [ w(t) * mean_over_dims (f(x_t, t) - target)^2 ],  target = eps | x_0 | v
Min-SNR-gamma weighting (Hang et al. 2023, Eq. 4 and its Sec. 3.4 conversions): the x_0-space weight is
min(SNR, gamma); since ||eps - eps_hat||^2 = SNR ||x0 - x0_hat||^2 and ||v - v_hat||^2 = (SNR + 1) ||x0 - x0_hat||^2,
the weight on the eps loss is min(SNR, gamma) / SNR and on the v loss min(SNR, gamma) / (SNR + 1).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.diffusion import process
from iclr24_jax.diffusion.schedules import Schedule

WEIGHTINGS = ("none", "min_snr")
COND_KEYS = ("class_labels", "cond", "context", "context_mask")


def loss_weight(snr: jax.Array, prediction: str = "eps", weighting: str = "none", min_snr_gamma: float = 5.0
                ) -> jax.Array:
  """Per-example loss weight [B] for a prediction type.

  Args:
    snr: [B] SNR(t) of each example.
    prediction: 'eps' | 'x0' | 'v' (the loss's target).
    weighting: 'none' (w = 1, DDPM's L_simple for eps) or 'min_snr' (Hang et al. 2023).
    min_snr_gamma: gamma of min-SNR.
  """
  if weighting == "none":
    return jnp.ones_like(snr)
  if weighting != "min_snr":
    raise ValueError(f"unknown loss weighting '{weighting}'; choose one of {WEIGHTINGS}.")
  clipped = jnp.minimum(snr, min_snr_gamma)
  if prediction == "x0":
    return clipped
  if prediction == "eps":
    return clipped / snr
  if prediction == "v":
    return clipped / (snr + 1.0)
  raise ValueError(f"unknown prediction type '{prediction}'; choose one of {process.PREDICTIONS}.")


def diffusion_loss(denoise_fn: Callable[[jax.Array, jax.Array], jax.Array], x0: jax.Array, key: jax.Array,
                   schedule: Schedule, *, prediction: str = "eps", weighting: str = "none",
                   min_snr_gamma: float = 5.0, t: jax.Array | None = None, noise: jax.Array | None = None
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The denoising loss of one batch.   # DDPM Algorithm 1, Eq. (14)

  Args:
    denoise_fn: (x_t [B, ...], t [B]) -> prediction [B, ...] (a network with its params bound).
    x0: [B, ...] clean data.
    key: draws t and eps (unless given).
    schedule: a DiscreteSchedule or ContinuousSchedule.
    prediction: the network's target: 'eps' | 'x0' | 'v'.
    weighting: 'none' or 'min_snr'.
    min_snr_gamma: gamma of min-SNR.
    t: optional fixed times [B] (schedule units).
    noise: optional fixed eps [B, ...].

  Returns:
    (scalar loss, aux dict with per_example [B] weighted losses, mse [B] unweighted, t [B]).
  """
  if not jnp.issubdtype(x0.dtype, jnp.floating):
    raise ValueError(f"x0 must be floating point, got {x0.dtype}.")
  b = x0.shape[0]
  key_t, key_n = jax.random.split(key)
  t = schedule.sample_time(key_t, (b,)) if t is None else t
  noise = jax.random.normal(key_n, x0.shape, x0.dtype) if noise is None else noise
  alpha_bar = schedule.alpha_bar(t)
  x_t = process.q_sample(x0, alpha_bar, noise)                                  # Eq. (4)
  out = denoise_fn(x_t, t)
  if out.shape != x0.shape:
    raise ValueError(f"the network returned shape {out.shape} for data of shape {x0.shape}.")
  target = process.target_for(x0, noise, alpha_bar, prediction)
  mse = jnp.mean(((out - target) ** 2).reshape(b, -1), axis=-1)              # Eq. (14), per example
  w = loss_weight(schedule.snr(t), prediction, weighting, min_snr_gamma)  # snr from log-SNR: exact near t = 0
  per_example = w * mse
  return jnp.mean(per_example), {"per_example": per_example, "mse": mse, "t": t}


def drop_condition(key: jax.Array, value: jax.Array, null_value: Any, prob: float) -> jax.Array:
  """Replaces each example's condition by `null_value` with probability `prob` (classifier-free guidance training).

  Args:
    key: randomness.
    value: [B, ...] condition.
    null_value: scalar or broadcastable "no condition" value.
    prob: drop probability.

  Returns:
    [B, ...] condition with dropped rows replaced.
  """
  drop = jax.random.bernoulli(key, prob, (value.shape[0],))
  drop = drop.reshape((-1,) + (1,) * (value.ndim - 1))
  return jnp.where(drop, jnp.asarray(null_value, value.dtype), value)


def model_kwargs(batch: Mapping[str, Any]) -> dict[str, Any]:
  """The conditioning entries of a batch, renamed for the model: 'y' -> class_labels; cond, context, context_mask."""
  kw = {k: batch[k] for k in COND_KEYS if k in batch}
  if "y" in batch and "class_labels" not in kw:
    kw["class_labels"] = batch["y"]
  return kw


def init(key: jax.Array, model: nn.Module, x_shape: tuple[int, ...], tx: optax.GradientTransformation, *,
         ema: bool = False, **example_kwargs) -> TrainState:
  """Initialises a denoiser -> TrainState (extra = {'ema_params': params} when ema).

  Args:
    key: init key.
    model: a UNet / MLPDenoiser (or any module with the same call signature).
    x_shape: one example's shape, e.g. (16, 16, 1) or (D,).
    tx: the optimizer.
    ema: keep an exponential moving average of the params in extra['ema_params'].
    **example_kwargs: example conditioning with batch axis 1 (class_labels=..., cond=..., context=...).

  Returns:
    TrainState (step 0; extra = {'ema_params': params} when ema, else {}).
  """
  x = jnp.zeros((1,) + tuple(x_shape), jnp.float32)
  params = model.init({"params": key}, x, jnp.zeros((1,), jnp.float32), **example_kwargs)["params"]
  return TrainState.create(params, tx, extra={"ema_params": params} if ema else {})



def make_train_step(model: nn.Module, schedule: Schedule, *, prediction: str = "eps", weighting: str = "none",
                    min_snr_gamma: float = 5.0, cond_drop_prob: float = 0.0, ema_decay: float = 0.0) -> Callable:
  """Returns the pure `train_step(state, batch, key) -> (state, metrics)` for `common.loop.train_loop`.

  The batch is {'x': [B, ...]} plus optional conditioning ('y' or 'class_labels', 'cond', 'context',
  'context_mask'). With cond_drop_prob > 0 each example's class label becomes the null label
  (model.num_classes) and a vector condition / context becomes zeros with that probability, training the
  unconditional model for classifier-free guidance (Ho & Salimans 2022, Algorithm 1).

  Args:
    model: the denoiser module.
    schedule: the noise schedule.
    prediction, weighting, min_snr_gamma: see `diffusion_loss`.
    cond_drop_prob: condition dropout probability.
    ema_decay: > 0 updates extra['ema_params'] (the state must be made with ema=True).
  """

  def train_step(state: TrainState, batch: Mapping[str, Any], key: jax.Array):
    key = jax.random.fold_in(key, state.step)
    key_loss, key_drop, key_dropout = jax.random.split(key, 3)
    kw = model_kwargs(batch)
    if cond_drop_prob > 0:
      drop = jax.random.bernoulli(key_drop, cond_drop_prob, (batch["x"].shape[0],))  # one mask for all inputs
      for name in list(kw):
        if name == "context_mask":
          continue
        null = getattr(model, "num_classes", 0) if name == "class_labels" else 0
        v = kw[name]
        kw[name] = jnp.where(drop.reshape((-1,) + (1,) * (v.ndim - 1)), jnp.asarray(null, v.dtype), v)

    def loss_of(params):
      fn = lambda x_t, t: model.apply({"params": params}, x_t, t, train=True,  # noqa: E731
                                      rngs={"dropout": key_dropout}, **kw)
      return diffusion_loss(fn, batch["x"], key_loss, schedule, prediction=prediction, weighting=weighting,
                            min_snr_gamma=min_snr_gamma)

    (loss, aux), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
    new_state = state.apply_gradients(grads)
    if ema_decay:
      if not state.extra or "ema_params" not in state.extra:
        raise ValueError("ema_decay > 0 needs a state made with init(..., ema=True).")
      ema = optax.incremental_update(new_state.params, state.extra["ema_params"], 1.0 - ema_decay)
      new_state = new_state.replace(extra={**state.extra, "ema_params": ema})
    return new_state, {"loss": loss, "mse": jnp.mean(aux["mse"]), "grad_norm": optax.global_norm(grads)}

  return train_step


def make_denoiser(model: nn.Module, params: Any, cond_name: str | None = None, **fixed_kwargs) -> Callable:
  """Binds a trained network into a sampler's denoiser.

  Args:
    model: the module.
    params: its params (e.g. state.params or state.extra['ema_params']).
    cond_name: if given ('class_labels', 'cond', 'context'), the denoiser takes a third argument passed as
      that keyword (what `samplers.sample(cond=..., guidance_scale=...)` calls).
    **fixed_kwargs: conditioning fixed for every call.

  Returns:
    denoiser(x_t, t) -> prediction, or denoiser(x_t, t, c) when cond_name is set.
  """
  if cond_name is None:
    return lambda x_t, t: model.apply({"params": params}, x_t, t, **fixed_kwargs)
  if cond_name not in COND_KEYS:
    raise ValueError(f"cond_name must be one of {COND_KEYS}, got '{cond_name}'.")
  return lambda x_t, t, c: model.apply({"params": params}, x_t, t, **{cond_name: c}, **fixed_kwargs)
