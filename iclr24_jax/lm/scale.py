"""Paper-size programs of the LM family for `common.scale`: parameter shardings, train and scoring programs.

The papers' `study.scale_program(config, mesh)` build their `common.scale.Program` from these, so the six LM
papers share one path (see `common/scale.py` for the interface):

  config = lm.llama.llama2_config('7b', remat='full')
  program = lm.scale.train_program('llama2_7b finetuning', config, tx, mesh, lm.scale.causal_batch(64, 1024),
                                   compute_dtype=jnp.bfloat16, hand_flops=lm.scale.llama_flops(config, 64, 1024))
  row = common.scale.analyse(program, mesh)

Parameters are sharded by logical axis names (`llama_logical_axes`, `t5_logical_axes`; MaxText's names): the
model width 'embed' over the mesh's 'data' axis (FSDP: each device keeps 1/data of every matrix and gathers a
layer's weights when it runs it), attention heads, MLP width and vocabulary over 'model' (tensor parallelism).
A stacked Llama (`llama.stack_layers`) keeps its [L] layer axis whole.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from iclr24_jax.common import scale as scale_lib
from iclr24_jax.lm import llama
from iclr24_jax.lm import lora as lora_lib
from iclr24_jax.lm import scoring
from iclr24_jax.lm import t5
from iclr24_jax.lm import train as lm_train

# Dense layers by name -> logical axes of their kernel [in, out] (Llama and T5 names; LoRA adapters follow them).
DENSE_AXES = {
    "q_proj": ("embed", "heads"), "k_proj": ("embed", "kv"), "v_proj": ("embed", "kv"),
    "qkv_proj": ("embed", "heads"), "o_proj": ("heads", "embed"),
    "gate_proj": ("embed", "mlp"), "up_proj": ("embed", "mlp"), "gate_up_proj": ("embed", "mlp"),
    "down_proj": ("mlp", "embed"), "lm_head": ("embed", "vocab"),
    "q": ("embed", "heads"), "k": ("embed", "heads"), "v": ("embed", "heads"), "o": ("heads", "embed"),
    "wi": ("embed", "mlp"), "wi_0": ("embed", "mlp"), "wi_1": ("embed", "mlp"), "wo": ("mlp", "embed"),
}
# Arrays that are not dense layers, by name.
TABLE_AXES = {"embed": ("vocab", "embed"), "shared": ("vocab", "embed"), "pos_embed": (None, "embed"),
              "rel_bias": (None, None), "scale": ("norm",)}


def _key(k) -> str:
  return str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))


def _leaf_axes(path, x) -> tuple:
  names = [_key(k) for k in path]
  leaf, parent = names[-1], (names[-2] if len(names) > 1 else "")
  if parent in DENSE_AXES and leaf in ("kernel", "bias", "lora_a", "lora_b"):
    d_in, d_out = DENSE_AXES[parent]
    base = {"kernel": (d_in, d_out), "bias": (d_out,), "lora_a": (d_in, None), "lora_b": (None, d_out)}[leaf]
  elif leaf in TABLE_AXES:
    base = TABLE_AXES[leaf]
  else:
    base = (None,) * len(x.shape)  # anything else (LoRA scales, quantised tables): whole on every device
  if len(x.shape) == len(base) + 1 and "layers" in names:
    base = ("layers",) + tuple(base)  # the stacked [L] axis of a scanned Llama
  if len(base) != len(x.shape):
    return (None,) * len(x.shape)
  return tuple(base)


def logical_axes(params: Any) -> Any:
  """Logical axis names for every leaf of a Llama or T5 parameter pytree (list or stacked layers).

  Kernels [in, out] of the dense layers get the names in `DENSE_AXES` (e.g. q_proj ('embed', 'heads'),
  down_proj ('mlp', 'embed')); embedding tables ('vocab', 'embed'); norms ('norm',); a stacked layer axis
  'layers'. Leaves the tables do not name (T5's relative-position table, LoRA scales) get None axes.

  Args:
    params: pytree of arrays or ShapeDtypeStructs (`llama.init_params` / `t5.init_params` layout).

  Returns:
    The same structure with a tuple of names (or None) per leaf.
  """
  return jax.tree_util.tree_map_with_path(_leaf_axes, params)


def param_shardings(params: Any, mesh: Mesh, rules=scale_lib.DEFAULT_RULES) -> Any:
  """NamedShardings of a Llama / T5 parameter pytree: FSDP on 'data', tensor parallelism on 'model'.

  Args:
    params: pytree of arrays or ShapeDtypeStructs.
    mesh: a ('data', 'model') mesh.
    rules: logical name -> mesh axis (default `common.scale.DEFAULT_RULES`).

  Returns:
    Pytree of NamedSharding (dimensions the mesh axis does not divide stay whole).
  """
  return scale_lib.logical_shardings(params, logical_axes(params), mesh, rules)


def named_model(name: str, **changes) -> Any:
  """A released architecture by the name a paper config uses, in the scanned (stacked-layer) form.

  Args:
    name: 'llama2_7b', 'llama2_13b', 'llama2_70b' (`llama.llama2_config`) or a `t5.T5_SHAPES` name ('t5-base',
      't5-large', 'flan-t5-large', 'flan-t5-xl').
    **changes: other config fields (e.g. remat='full').

  Returns:
    LlamaConfig or t5.T5Config with scan_layers=True.

  Raises:
    ValueError: unknown name.
  """
  if name.startswith("llama2_"):
    return llama.llama2_config(name[len("llama2_"):], **changes)
  if name in t5.T5_SHAPES:
    return t5.named_config(name, **{"scan_layers": True, **changes})
  raise ValueError(f"unknown model {name!r}; choose llama2_7b, llama2_13b, llama2_70b or one of "
                   f"{sorted(t5.T5_SHAPES)}.")


# ------------------------------------------------------------------------------------------------- FLOPs


def llama_flops(config: llama.LlamaConfig, batch_size: int, seq_len: int, training: bool = True,
                last_only: bool = False) -> float:
  """Matmul FLOPs of one step by hand (Kaplan et al. 2020 / the PaLM appendix): 2 x weights x tokens forward,
  plus the attention scores and mixing 4 x T x (heads x head_dim) per token and layer (the full T x T product
  is computed, then masked); a training step is 3 x the forward (no rematerialisation counted).

  Args:
    config: the model.
    batch_size: rows B.
    seq_len: tokens T per row.
    training: forward + backward (3x) or forward only.
    last_only: the output head runs at one position per row (prefill scoring) instead of all T.

  Returns:
    FLOPs of the whole step (all devices).
  """
  d, h, kv, hd, f, n_layers = (config.hidden_size, config.num_heads, config.num_kv_heads, config.dim_head,
                               config.intermediate_size, config.num_layers)
  mlp = (3 if config.mlp == "swiglu" else 2) * d * f
  attn = d * h * hd + 2 * d * kv * hd + h * hd * d
  per_token = n_layers * (2 * (attn + mlp) + 4 * seq_len * h * hd)
  head = 2 * d * config.vocab_size
  forward = batch_size * seq_len * per_token + (batch_size if last_only else batch_size * seq_len) * head
  return float(3 * forward if training else forward)


def t5_flops(config: t5.T5Config, batch_size: int, enc_len: int, dec_len: int, training: bool = True) -> float:
  """Matmul FLOPs of a T5 step by hand (encoder over S tokens, teacher-forced decoder over T tokens).

  Per encoder token and layer: 2 x (4 D x inner + MLP) + 4 S inner; per decoder token and layer: self-attention
  2 x 4 D inner + 4 T inner, cross-attention queries / output 2 x 2 D inner + 4 S inner, MLP; the cross keys /
  values 2 x 2 D inner per encoder token and decoder layer; the head 2 D V per decoder token. Training: 3x.

  Args:
    config: the T5 model (inner = num_heads x d_kv).
    batch_size: rows B.
    enc_len: encoder tokens S.
    dec_len: decoder tokens T.
    training: forward + backward (3x) or forward only.

  Returns:
    FLOPs of the whole step (all devices).
  """
  d, inner, f, v = config.d_model, config.num_heads * config.d_kv, config.d_ff, config.vocab_size
  mlp = (3 if config.feed_forward_proj == "gated-gelu" else 2) * d * f
  s, t = enc_len, dec_len
  enc = s * config.num_layers * (2 * (4 * d * inner + mlp) + 4 * s * inner)
  dec = t * config.n_dec * (2 * 4 * d * inner + 4 * t * inner + 2 * 2 * d * inner + 4 * s * inner + 2 * mlp)
  cross_kv = s * config.n_dec * 2 * 2 * d * inner
  forward = batch_size * (enc + dec + cross_kv + t * 2 * d * v)
  return float(3 * forward if training else forward)


# ------------------------------------------------------------------------------------------------ programs


def causal_batch(batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract decoder batch: ids [B, T] int32, mask and loss_mask [B, T] bool (see `lm.train`)."""
  return {"ids": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32),
          "mask": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.bool_),
          "loss_mask": jax.ShapeDtypeStruct((batch_size, seq_len), jnp.bool_)}


def seq2seq_batch(batch_size: int, enc_len: int, dec_len: int) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract T5 batch: inputs / input_mask [B, S], labels / label_mask [B, T] (see `t5.seq2seq_loss`)."""
  return {"inputs": jax.ShapeDtypeStruct((batch_size, enc_len), jnp.int32),
          "input_mask": jax.ShapeDtypeStruct((batch_size, enc_len), jnp.bool_),
          "labels": jax.ShapeDtypeStruct((batch_size, dec_len), jnp.int32),
          "label_mask": jax.ShapeDtypeStruct((batch_size, dec_len), jnp.bool_)}


def _init_fn(model_config: Any) -> Callable:
  if isinstance(model_config, llama.LlamaConfig):
    return llama.init_params
  if isinstance(model_config, t5.T5Config):
    return t5.init_params
  raise TypeError(f"no LM parameters for a config of type {type(model_config).__name__}; expected LlamaConfig or "
                  "t5.T5Config.")


def abstract_params(model_config: Any, dtype: Any = jnp.float32) -> Any:
  """The parameter pytree of `model_config` as ShapeDtypeStructs (nothing allocated: `jax.eval_shape`)."""
  init = _init_fn(model_config)
  return jax.eval_shape(lambda: init(jax.random.key(0), model_config, dtype=dtype))


def _key_struct(mesh: Mesh) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P()))


def train_program(name: str, model_config: Any, tx: optax.GradientTransformation, mesh: Mesh,
                  batch: Mapping[str, jax.ShapeDtypeStruct], *, loss_fn: Callable | None = None,
                  lora_config: lora_lib.LoraConfig | None = None, keep_reference: bool = False,
                  param_dtype: Any = jnp.float32, compute_dtype: Any = None, hand_flops: float | None = None,
                  items_per_step: int = 0, notes: str = "", paper_hardware: str = "",
                  paper_time: str = "") -> scale_lib.Program:
  """A full or LoRA finetuning step of a Llama or T5 (`lm.train.make_train_step`) as a `common.scale.Program`.

  The state (parameters in `param_dtype`, optimizer state, the frozen reference or LoRA base in `extra`) is
  sharded by `param_shardings`, the batch over 'data'; the state is donated and comes back with the same
  shardings.

  Args:
    name: the row's name.
    model_config: LlamaConfig (stacked layers for paper sizes) or t5.T5Config.
    tx: the optimizer.
    mesh: the ('data', 'model') mesh.
    batch: abstract batch (`causal_batch`, `seq2seq_batch`, or the loss's own keys), [B, ...] leaves.
    loss_fn: the loss (default `lm.train.default_loss`); one with `ref_params` also reads the reference.
    lora_config: train LoRA adapters (list-form layers only) instead of all parameters.
    keep_reference: full finetuning with a frozen copy of the parameters (a KL term's reference).
    param_dtype: dtype of the stored parameters (float32 master weights, or bfloat16).
    compute_dtype: None, or the dtype the model runs in (mixed precision; see `make_train_step`).
    hand_flops: the step's FLOPs by hand (all devices), e.g. `llama_flops(...)`.
    items_per_step: tokens per step.
    notes, paper_hardware, paper_time: text for the table.

  Returns:
    common.scale.Program with args (state, batch, key), donate_argnums (0,), carry=True.
  """
  init = _init_fn(model_config)

  def init_state():
    params = init(jax.random.key(0), model_config, dtype=param_dtype)
    return lm_train.init_train_state(params, tx, lora_config=lora_config, key=jax.random.key(1),
                                     keep_reference=keep_reference)

  state = jax.eval_shape(init_state)
  rep = NamedSharding(mesh, P())
  if lora_config is None:
    p_sh = param_shardings(state.params, mesh)
    extra = {"reference": p_sh} if keep_reference else scale_lib.replicated(state.extra, mesh)
  else:
    p_sh = scale_lib.replicated(state.params, mesh)  # adapters: r x width, small
    extra = {"base": param_shardings(state.extra["base"], mesh)}
  state_sh = scale_lib.train_state_shardings(state, p_sh, mesh, extra=extra)
  state_abs = scale_lib.abstract(state, state_sh)
  batch_abs = scale_lib.abstract(batch, scale_lib.batch_shardings(batch, mesh))
  step = lm_train.make_train_step(model_config, lora_config, loss_fn=loss_fn, compute_dtype=compute_dtype)
  frozen = state.extra.get("base", state.extra.get("reference")) if isinstance(state.extra, dict) else None
  n_params = scale_lib.num_elements(frozen if frozen is not None else state.params)
  return scale_lib.Program(
      name=name, fn=step, args=(state_abs, batch_abs, _key_struct(mesh)), out_shardings=(state_sh, rep),
      donate_argnums=(0,), params=n_params, items_per_step=items_per_step, hand_flops=hand_flops, kind="train",
      carry=True, abstract_params=state_abs.params if lora_config is None else state_abs.extra["base"],
      notes=notes, paper_hardware=paper_hardware, paper_time=paper_time)


def llama_choice_program(name: str, config: llama.LlamaConfig, mesh: Mesh, batch_size: int, seq_len: int,
                         num_options: int, *, param_dtype: Any = jnp.bfloat16, notes: str = "",
                         paper_hardware: str = "", paper_time: str = "") -> scale_lib.Program:
  """A judging / annotation batch: one prefill of B prompts and the log-probabilities of O one-token options.

  `fn(params, ids [B, T], mask [B, T], option_ids [O]) -> [B, O]` = `lm.next_token_logprobs` at the options
  (what `lm.choice_logprobs` computes for one-token options, e.g. '1' / '2', or 'a' / 'b' after 'Output (').

  Args:
    name: the row's name.
    config: the judge's LlamaConfig (stacked layers for paper sizes).
    mesh: the ('data', 'model') mesh.
    batch_size: prompts B per step.
    seq_len: prompt width T (left-padded).
    num_options: O.
    param_dtype: the stored weights' dtype (bfloat16 or float16 in the papers' judges).
    notes, paper_hardware, paper_time: text for the table.

  Returns:
    common.scale.Program (kind 'inference').
  """
  def judge(params, ids, mask, option_ids):
    return jnp.take(scoring.next_token_logprobs(params, config, ids, mask), option_ids, axis=-1)

  params = abstract_params(config, param_dtype)
  params_abs = scale_lib.abstract(params, param_shardings(params, mesh))
  data = NamedSharding(mesh, P("data"))
  ids = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32, sharding=data)
  mask = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.bool_, sharding=data)
  options = jax.ShapeDtypeStruct((num_options,), jnp.int32, sharding=NamedSharding(mesh, P()))
  return scale_lib.Program(
      name=name, fn=judge, args=(params_abs, ids, mask, options), out_shardings=data,
      params=scale_lib.num_elements(params), items_per_step=batch_size * seq_len,
      hand_flops=llama_flops(config, batch_size, seq_len, training=False, last_only=True), kind="inference",
      abstract_params=params_abs, notes=notes, paper_hardware=paper_hardware, paper_time=paper_time)


def t5_choice_program(name: str, config: t5.T5Config, mesh: Mesh, batch_size: int, enc_len: int,
                      num_options: int, *, param_dtype: Any = jnp.float32, notes: str = "",
                      paper_hardware: str = "", paper_time: str = "") -> scale_lib.Program:
  """A T5 scoring batch: encode B prompts of S tokens, one decoder step, log-probabilities of O option tokens.

  `fn(params, enc_ids [B, S], enc_mask [B, S], option_ids [O]) -> [B, O]`: the distribution of the first
  answer token (e.g. the score '1'...'10' a feature question asks for), read as expected scores.

  Args:
    name: the row's name.
    config: the T5Config.
    mesh: the ('data', 'model') mesh.
    batch_size: prompts B per step.
    enc_len: encoder width S.
    num_options: O.
    param_dtype: the stored weights' dtype.
    notes, paper_hardware, paper_time: text for the table.

  Returns:
    common.scale.Program (kind 'inference').
  """
  def score(params, enc_ids, enc_mask, option_ids):
    start = jnp.full((enc_ids.shape[0], 1), config.decoder_start_id, jnp.int32)
    logits = t5.forward(params, config, enc_ids, enc_mask, start)[:, 0]  # [B, V]
    return jnp.take(jax.nn.log_softmax(logits, axis=-1), option_ids, axis=-1)

  params = abstract_params(config, param_dtype)
  params_abs = scale_lib.abstract(params, param_shardings(params, mesh))
  data = NamedSharding(mesh, P("data"))
  enc_ids = jax.ShapeDtypeStruct((batch_size, enc_len), jnp.int32, sharding=data)
  enc_mask = jax.ShapeDtypeStruct((batch_size, enc_len), jnp.bool_, sharding=data)
  options = jax.ShapeDtypeStruct((num_options,), jnp.int32, sharding=NamedSharding(mesh, P()))
  return scale_lib.Program(
      name=name, fn=score, args=(params_abs, enc_ids, enc_mask, options), out_shardings=data,
      params=scale_lib.num_elements(params), items_per_step=batch_size * enc_len,
      hand_flops=t5_flops(config, batch_size, enc_len, 1, training=False), kind="inference",
      abstract_params=params_abs, notes=notes, paper_hardware=paper_hardware, paper_time=paper_time)
