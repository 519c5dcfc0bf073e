"""LM finetuning: the masked next-token loss, KL to a frozen reference, and full or LoRA train / eval steps
for `common.loop`, for the decoder-only LM (`LlamaConfig`) and the encoder-decoder (`t5.T5Config`).

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

KL to a reference policy: a `loss_fn` with a `ref_params` argument receives the frozen parameters: with
LoRA the base model itself (no second copy of the weights), with full finetuning a copy kept by
`init_train_state(..., keep_reference=True)`. `kl_regularized_loss(beta)` is such a loss:
NLL + beta * KL(pi || pi_ref) per target token, the form of Quark / MaRio's objective.

  step = make_train_step(config, lora_config, loss_fn=kl_regularized_loss(beta=0.1))
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common.train_state import TrainState
from iclr24_jax.lm import llama
from iclr24_jax.lm import lora as lora_lib
from iclr24_jax.lm import scoring
from iclr24_jax.lm import t5


def causal_target_logits(params: llama.Params, config: llama.LlamaConfig, batch: Mapping[str, jax.Array]
                         ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Next-token logits aligned with the tokens they predict, and the per-token loss weights.

  Args:
    params: LM parameters.
    config: LlamaConfig.
    batch: ids [B, T], mask [B, T] (real tokens, either side padded), optional loss_mask [B, T].

  Returns:
    (logits [B, T, V] float32: logits[:, t] predicts ids[:, t] from the real tokens before it;
     targets = ids [B, T]; weight [B, T] float32: 1 at real tokens that have a real predecessor and are
     in loss_mask).
  """
  ids = batch["ids"]
  if ids.ndim != 2:
    raise ValueError(f"batch['ids'] must be [batch, time], got shape {ids.shape}.")
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
  return logits, ids, weight.astype(jnp.float32)


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
  logits, ids, w = causal_target_logits(params, config, batch)
  lp = scoring.logprobs_from_logits(logits, ids)
  n = jnp.maximum(jnp.sum(w), 1.0)
  loss = -jnp.sum(lp * w) / n
  acc = jnp.sum((jnp.argmax(logits, -1) == ids) * w) / n
  return loss, {"loss": loss, "accuracy": acc, "tokens": jnp.sum(w)}


def target_logits(params: Any, config: Any, batch: Mapping[str, jax.Array]
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(logits [B, T, V], targets [B, T], weight [B, T]) for either model family.

  `LlamaConfig`: `causal_target_logits` (batch ids / mask / loss_mask); `t5.T5Config`: `t5.label_logits`
  (batch inputs or input_embeds / input_mask / labels / label_mask / loss_mask).

  Args:
    params: the model's parameters.
    config: LlamaConfig or t5.T5Config (selects the family).
    batch: mapping of the family's batch arrays above ([B, T] ids / masks).

  Returns:
    (logits [B, T, V] float32, targets [B, T] int ids, weight [B, T] float loss weights).

  Raises:
    TypeError: config is neither LlamaConfig nor T5Config.
  """
  if isinstance(config, t5.T5Config):
    return t5.label_logits(params, config, batch)
  if isinstance(config, llama.LlamaConfig):
    return causal_target_logits(params, config, batch)
  raise TypeError(f"no target logits for a config of type {type(config).__name__}; expected LlamaConfig or "
                  "t5.T5Config.")


def default_loss(config: Any) -> Callable:
  """The training loss of a model family: `causal_lm_loss` (LlamaConfig) or `t5.seq2seq_loss` (T5Config)."""
  if isinstance(config, t5.T5Config):
    return t5.seq2seq_loss
  if isinstance(config, llama.LlamaConfig):
    return causal_lm_loss
  raise TypeError(f"no default loss for a config of type {type(config).__name__}; pass loss_fn=... "
                  "(params, config, batch) -> (loss, metrics).")


def token_kl(logits: jax.Array, ref_logits: jax.Array) -> jax.Array:
  """KL(pi || pi_ref) of the next-token distributions at every position.

  Eq. (Quark / MaRio's KL term): sum_v pi(v) (log pi(v) - log pi_ref(v)), with pi = softmax(logits)
  and pi_ref = softmax(ref_logits) (the official code's `KLDivLoss(log_softmax(ref), softmax(pi))`
  summed over the vocabulary).

  Args:
    logits: [..., V] the trained policy's logits.
    ref_logits: [..., V] the reference policy's logits (no gradient flows into them).

  Returns:
    [...] float32, >= 0; exactly 0 where the two logits are equal.
  """
  if logits.shape != ref_logits.shape:
    raise ValueError(f"logits {logits.shape} and ref_logits {ref_logits.shape} must have the same shape.")
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  ref_logp = jax.nn.log_softmax(jax.lax.stop_gradient(ref_logits).astype(jnp.float32), axis=-1)
  return jnp.sum(jnp.exp(logp) * (logp - ref_logp), axis=-1)


def kl_regularized_loss(beta: float, entropy_coef: float = 0.0) -> Callable:
  """NLL + beta * KL(pi || pi_ref) - entropy_coef * entropy, averaged over the target tokens.

  The regulariser of Quark-style training (MaRio: beta 0.1): the policy and the reference are run on the
  same batch; the reference is the frozen base (LoRA) or the kept copy (full finetuning).

  Args:
    beta: KL weight (>= 0).
    entropy_coef: weight of the entropy bonus (>= 0; 0 = off).

  Returns:
    `loss_fn(params, config, batch, ref_params) -> (loss, {'loss', 'nll', 'kl', 'entropy', 'accuracy',
    'tokens'})` for `make_train_step` / `make_eval_step` (either model family).
  """
  if beta < 0 or entropy_coef < 0:
    raise ValueError(f"beta and entropy_coef must be >= 0, got {beta} and {entropy_coef}.")

  def loss_fn(params, config, batch, ref_params):
    logits, targets, w = target_logits(params, config, batch)
    ref_logits, _, _ = target_logits(ref_params, config, batch)
    logp = jax.nn.log_softmax(logits, axis=-1)
    n = jnp.maximum(jnp.sum(w), 1.0)
    nll = -jnp.sum(jnp.take_along_axis(logp, targets[..., None], -1)[..., 0] * w) / n
    kl = jnp.sum(token_kl(logits, ref_logits) * w) / n
    entropy = jnp.sum(-jnp.sum(jnp.exp(logp) * logp, axis=-1) * w) / n
    loss = nll + beta * kl - entropy_coef * entropy
    acc = jnp.sum((jnp.argmax(logits, -1) == targets) * w) / n
    return loss, {"loss": loss, "nll": nll, "kl": kl, "entropy": entropy, "accuracy": acc, "tokens": jnp.sum(w)}

  return loss_fn


def init_train_state(params: llama.Params, tx: optax.GradientTransformation,
                     lora_config: lora_lib.LoraConfig | None = None, key: jax.Array | None = None,
                     keep_reference: bool = False) -> TrainState:
  """A TrainState for full finetuning, or for LoRA (adapters trainable, base in `extra['base']`).

  Args:
    params: the (pretrained or random) LM or T5 parameters.
    tx: the optax optimizer.
    lora_config: LoRA settings, or None for full finetuning.
    key: PRNG key for the adapters' A matrices (required with LoRA).
    keep_reference: full finetuning only: keep a frozen copy of `params` in `extra['reference']` for a
      loss with a KL term (with LoRA the base already is the reference: nothing is copied).

  Returns:
    TrainState at step 0.
  """
  if lora_config is None:
    if keep_reference:
      return TrainState.create(params=params, tx=tx, extra={"reference": jax.tree.map(jnp.copy, params)})
    return TrainState.create(params=params, tx=tx)
  if key is None:
    raise ValueError("init_train_state with lora_config needs a key to initialise the adapters.")
  adapters = lora_lib.init_params(key, params, lora_config)
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
  """The parameters the model runs with: state.params, or the base with the adapters merged in.

  Args:
    state: TrainState (its params are the adapters when training LoRA; the base is in state.extra['base']).
    lora_config: the LoraConfig of the adapters, or None for full finetuning.

  Returns:
    model params pytree (`lora.merge`d when lora_config is given).

  Raises:
    ValueError: lora_config given but the state holds no base params.
  """
  if lora_config is None:
    return state.params
  return lora_lib.merge(_base(state), state.params, lora_config)


def wants_reference(loss_fn: Callable) -> bool:
  """Whether `loss_fn` takes the frozen reference parameters (it has an argument named `ref_params`)."""
  try:
    return "ref_params" in inspect.signature(loss_fn).parameters
  except (TypeError, ValueError):
    return False


def reference_params(state: TrainState, lora_config: lora_lib.LoraConfig | None = None) -> Any:
  """The frozen reference policy: the LoRA base, or the copy kept by `init_train_state(keep_reference=True)`.

  Args:
    state: TrainState.
    lora_config: the LoraConfig when training adapters (the base is then the reference), else None.

  Returns:
    the reference params pytree.

  Raises:
    ValueError: the state keeps no reference (nor LoRA base).
  """
  if lora_config is not None:
    return _base(state)
  if isinstance(state.extra, dict) and "reference" in state.extra:
    return state.extra["reference"]
  raise ValueError("this loss needs reference parameters (it has a `ref_params` argument), but the state has "
                   "none: with full finetuning build it with init_train_state(params, tx, keep_reference=True), "
                   "or train LoRA adapters (the base is the reference).")


def cast_floating(tree: Any, dtype: Any) -> Any:
  """The floating-point leaves of a pytree cast to `dtype` (integer / boolean leaves unchanged).

  Args:
    tree: pytree of arrays.
    dtype: e.g. jnp.bfloat16.

  Returns:
    The same structure; under `jax.grad` the gradients flow back to the original (e.g. float32) leaves.
  """
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _call_loss(loss_fn, params, config, batch, state, lora_config, compute_dtype=None):
  if wants_reference(loss_fn):
    ref = reference_params(state, lora_config)
    if compute_dtype is not None:
      ref = cast_floating(ref, compute_dtype)
    return loss_fn(params, config, batch, ref_params=ref)
  return loss_fn(params, config, batch)


def make_train_step(config: Any, lora_config: lora_lib.LoraConfig | None = None,
                    loss_fn: Callable | None = None, compute_dtype: Any = None) -> Callable:
  """A pure `step(state, batch, key) -> (state, metrics)` (compile with `common.loop.compile_step`).

  Args:
    config: LlamaConfig or t5.T5Config.
    lora_config: train LoRA adapters instead of all parameters.
    loss_fn: `(params, config, batch) -> (loss, metrics)`, default `default_loss(config)`
      (`causal_lm_loss` / `t5.seq2seq_loss`). A loss with a `ref_params` argument is also given the frozen
      reference parameters (see `reference_params`), e.g. `kl_regularized_loss(beta)`.
    compute_dtype: None (the model runs in the parameters' dtype) or e.g. jnp.bfloat16: mixed precision with
      master weights: the float32 parameters (and optimizer state) stay in the state, the model runs on a
      bfloat16 copy made inside the differentiated function, so gradients arrive in float32 (what bf16
      mixed-precision training in DeepSpeed / torch autocast keeps).

  Returns:
    The step function. `key` is accepted for the loop's signature (the loss is deterministic: no dropout).
  """
  loss_fn = loss_fn or default_loss(config)

  def step(state: TrainState, batch: Mapping[str, jax.Array], key: jax.Array):
    del key

    def objective(trainable):
      if lora_config is None:
        p = trainable
      else:
        p = lora_lib.apply(_base(state), trainable, lora_config)
      if compute_dtype is not None:
        p = cast_floating(p, compute_dtype)
      return _call_loss(loss_fn, p, config, batch, state, lora_config, compute_dtype)

    (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    metrics = dict(metrics)
    metrics["grad_norm"] = optax.global_norm(grads)
    return state.apply_gradients(grads), metrics

  return step


def make_eval_step(config: Any, lora_config: lora_lib.LoraConfig | None = None,
                   loss_fn: Callable | None = None) -> Callable:
  """`eval(state, batch) -> metrics` with the same loss as training (the decoder or T5).

  Args:
    config: LlamaConfig or t5.T5Config.
    lora_config: the adapters' settings when the state trains LoRA adapters.
    loss_fn: as in `make_train_step` (default `default_loss(config)`).

  Returns:
    The eval function (un-jitted); metrics as the loss returns them.
  """
  loss_fn = loss_fn or default_loss(config)

  def ev(state: TrainState, batch: Mapping[str, Any]):
    p = state.params if lora_config is None else lora_lib.apply(_base(state), state.params, lora_config)
    return _call_loss(loss_fn, p, config, batch, state, lora_config)[1]
  return ev
