"""Causal-LM finetuning: the masked next-token loss, and full or LoRA train steps for `common.loop`.

A batch is a dict of numpy/jax arrays:
  ids [B, T] int32, mask [B, T] bool (real tokens), optional loss_mask [B, T] bool (tokens to learn, e.g.
  only the answer of a prompt/answer pair; default every real token after the first).

  state = init_train_state(params, tx)                                   # full finetuning
  state = init_train_state(params, tx, lora_config=LoraConfig(...), key=k)  # LoRA: only adapters train
  step = make_train_step(config, lora_config)                            # step(state, batch, key)
  state, metrics = jax.jit(step, donate_argnums=0)(state, batch, key)

With LoRA, `state.params` holds the adapters and `state.extra['base']` the frozen base model. It rides
in the state so that the compiled step takes it as an argument: `jax.jit` embeds closed-over arrays in
the program as constants (slow to compile and a second copy in memory for a 135M-parameter model).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.lm import llama
from iclr24_jax.lm import lora as lora_lib
from iclr24_jax.lm import scoring


def causal_lm_loss(params: llama.Params, config: llama.LlamaConfig, batch: Mapping[str, jax.Array]
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean negative log-likelihood of the target tokens.

  Args:
    params: LM parameters.
    config: LlamaConfig.
    batch: ids [B, T], mask [B, T], optional loss_mask [B, T].

  Returns:
    (loss scalar, metrics {'loss', 'accuracy', 'tokens'}); accuracy is the greedy next-token accuracy
    on the target tokens.
  """
  ids = batch["ids"]
  mask = batch.get("mask")
  b, t = ids.shape
  mask = jnp.ones((b, t), bool) if mask is None else mask.astype(bool)
  hidden = llama.hidden_states(params, config, ids, mask)
  pos = jnp.arange(t, dtype=jnp.int32)[None]
  prev_real = jax.lax.cummax(jnp.where(mask, pos, -1), axis=1)
  src = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), prev_real[:, :-1]], axis=1)
  weight = mask & (src >= 0)
  if batch.get("loss_mask") is not None:
    weight = weight & batch["loss_mask"].astype(bool)
  src_hidden = jnp.take_along_axis(hidden, jnp.maximum(src, 0)[..., None], axis=1)
  logits = llama.output_logits(params, config, src_hidden).astype(jnp.float32)
  lp = scoring.logprobs_from_logits(logits, ids)
  w = weight.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(w), 1.0)
  loss = -jnp.sum(lp * w) / n
  acc = jnp.sum((jnp.argmax(logits, -1) == ids) * w) / n
  return loss, {"loss": loss, "accuracy": acc, "tokens": jnp.sum(w)}


def init_train_state(params: llama.Params, tx: optax.GradientTransformation,
                     lora_config: lora_lib.LoraConfig | None = None, key: jax.Array | None = None) -> TrainState:
  """A TrainState for full finetuning, or for LoRA (adapters trainable, base in `extra['base']`).

  Args:
    params: the (pretrained or random) LM parameters.
    tx: the optax optimizer.
    lora_config: LoRA settings, or None for full finetuning.
    key: PRNG key for the adapters' A matrices (required with LoRA).

  Returns:
    TrainState at step 0.
  """
  if lora_config is None:
    return TrainState.create(params=params, tx=tx)
  if key is None:
    raise ValueError("init_train_state with lora_config needs a key to initialise the adapters.")
  adapters = lora_lib.init(key, params, lora_config)
  return TrainState.create(params=adapters, tx=tx, extra={"base": params})


def params_from_host(params: llama.Params) -> llama.Params:
  """The given (concrete) params, usable inside a jitted init function without being embedded in the
  program as constants: they are fetched with `jax.pure_callback` at run time (a 135M-parameter model as
  closure constants costs ~12 s of compilation and two extra copies in memory; the callback ~0.3 s).

  Use as `init_fn = lambda key: init_train_state(params_from_host(params), tx, ...)` for `common.loop`.
  """
  host = jax.tree.map(np.asarray, jax.device_get(params))
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), host)
  return jax.pure_callback(lambda: host, shapes)


def _base(state: TrainState):
  if not isinstance(state.extra, dict) or "base" not in state.extra:
    raise ValueError("a LoRA state needs the base params in state.extra['base']: build it with "
                     "init_train_state(params, tx, lora_config=..., key=...).")
  return state.extra["base"]


def model_params(state: TrainState, lora_config: lora_lib.LoraConfig | None = None) -> llama.Params:
  """The parameters the model runs with: state.params, or the base with the adapters merged in."""
  if lora_config is None:
    return state.params
  return lora_lib.merge(_base(state), state.params, lora_config)


def make_train_step(config: llama.LlamaConfig, lora_config: lora_lib.LoraConfig | None = None,
                    loss_fn: Callable | None = None) -> Callable:
  """A pure `step(state, batch, key) -> (state, metrics)` (compile with `common.loop.compile_step`).

  Args:
    config: LlamaConfig.
    lora_config: train LoRA adapters instead of all parameters.
    loss_fn: `(params, config, batch) -> (loss, metrics)`, default `causal_lm_loss`.

  Returns:
    The step function. `key` is accepted for the loop's signature (the loss is deterministic: no dropout).
  """
  loss_fn = loss_fn or causal_lm_loss

  def step(state: TrainState, batch: Mapping[str, jax.Array], key: jax.Array):
    del key

    def objective(trainable):
      if lora_config is None:
        p = trainable
      else:
        p = lora_lib.apply(_base(state), trainable, lora_config)
      return loss_fn(p, config, batch)

    (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    metrics = dict(metrics)
    metrics["grad_norm"] = optax.global_norm(grads)
    return state.apply_gradients(grads), metrics

  return step


def make_eval_step(config: llama.LlamaConfig, lora_config: lora_lib.LoraConfig | None = None) -> Callable:
  """`eval(state, batch) -> metrics` with the same loss as training."""
  def ev(state: TrainState, batch: Mapping[str, Any]):
    p = state.params if lora_config is None else lora_lib.apply(_base(state), state.params, lora_config)
    return causal_lm_loss(p, config, batch)[1]
  return ev
