"""A decoder-only transformer LM (Llama-style, with GPT-2 style as a configuration) as pure JAX functions.

The model is a pure function of a parameter pytree (nested dicts of arrays, Flax-style names
`kernel` / `scale` / `bias`), so it composes with `jax.jit`, `jax.grad`, optax, orbax, LoRA (see
`lora.py`) and mesh sharding without wrappers:

  params = init_params(key, config)                       # or load_smollm2() / load_safetensors_llama()
  logits = forward(params, config, ids, mask)             # [B, T, V]
  logits, cache = forward(params, config, ids, mask, cache=cache)   # incremental decoding

Parameter layout (per layer `params['layers'][i]`, kernels are [in, out] so `y = x @ kernel`):
  attn_norm {scale[, bias]}, q_proj, k_proj, v_proj, o_proj {kernel[, bias]},
  mlp_norm {scale[, bias]}, gate_proj, up_proj, down_proj {kernel[, bias]}   (GELU MLP: up_proj, down_proj)
and at the top: embed [V, D], pos_embed [max_seq_len, D] (learned positions only), final_norm,
lm_head {kernel [D, V]} (untied head only). `fuse_params` merges q/k/v into `qkv_proj` and gate/up into
`gate_up_proj` (fewer, larger matmuls; what generation uses); `forward` accepts both forms.

Layers are a Python list iterated in Python (unrolled in the compiled program): on CPU that was measured
faster than `lax.scan` over stacked layers (see shared/notes/smollm2-offline.md). Paper-size models use the
stacked form instead (`config.scan_layers`, or `stack_layers(params)`): `params['layers']` is one dict whose
leaves carry a leading [L] axis, and the trunk is one `lax.scan` over it (one compiled layer however deep the
model; MaxText's `nn.scan`), optionally rematerialised per layer (`config.remat`: 'full' saves nothing and
recomputes each layer in the backward pass, 'dots' saves the matmul outputs; MaxText's `nn.remat` policies).
The stacked form serves training and scoring (no KV cache); `unstack_layers` gives the list form back for
cached decoding. `llama2_config('7b' | '13b' | '70b')` builds the Llama-2 shapes.

Rotary embeddings come in two layouts (`config.rope_layout`): 'half' (Hugging Face: rotate the two halves
of each head) and 'interleaved' (Meta/GGUF: rotate pairs (2i, 2i+1)). Weights converted from one layout
to the other need their q/k rows permuted; `gguf_io` does that.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common.sharding import constrain_batch
from iclr24_jax.lm import layers
from iclr24_jax.lm import quant

Params = dict[str, Any]

_NEG = -1e30  # finite "minus infinity": fully masked rows (padding queries) give a uniform softmax, not NaN
REMAT_POLICIES = ("none", "full", "dots")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Hyper-parameters of a decoder-only LM (hashable: usable as a static jit argument).

  Attributes:
    vocab_size: number of token ids.
    hidden_size: model width D.
    num_layers: number of transformer blocks.
    num_heads: query heads H.
    num_kv_heads: key/value heads (grouped-query attention; H must be a multiple).
    intermediate_size: MLP width F.
    head_dim: per-head width (default hidden_size // num_heads).
    rope_base: rotary base (theta); SmolLM2 uses 100000.
    rope_layout: 'half' (Hugging Face rotate-half) or 'interleaved' (Meta/GGUF pairs).
    norm_eps: epsilon of RMSNorm/LayerNorm.
    tie_embeddings: use the token embedding as the output head.
    max_seq_len: longest sequence (learned positions table size; generation checks it).
    norm: 'rms' (Llama) or 'layer' (GPT-2).
    mlp: 'swiglu' (Llama) or 'gelu' (GPT-2).
    position: 'rope' or 'learned' (GPT-2 absolute positions).
    use_bias: biases in the attention/MLP projections (GPT-2).
    scan_layers: `init_params` returns the stacked layer form ([L, ...] leaves, one `lax.scan` in the trunk).
    remat: rematerialisation of each layer in the uncached trunk: 'none', 'full' (save nothing: recompute the
      layer in the backward pass; what `gradient_checkpointing` does in Hugging Face) or 'dots' (save the matmul
      outputs, recompute the elementwise work).
  """

  vocab_size: int = 49152
  hidden_size: int = 576
  num_layers: int = 30
  num_heads: int = 9
  num_kv_heads: int = 3
  intermediate_size: int = 1536
  head_dim: int | None = None
  rope_base: float = 100000.0
  rope_layout: str = "half"
  norm_eps: float = 1e-5
  tie_embeddings: bool = True
  max_seq_len: int = 8192
  norm: str = "rms"
  mlp: str = "swiglu"
  position: str = "rope"
  use_bias: bool = False
  scan_layers: bool = False
  remat: str = "none"

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}.")
    if self.head_dim is None and self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                       "set head_dim explicitly.")
    for name, value, allowed in (("rope_layout", self.rope_layout, ("half", "interleaved")),
                                 ("norm", self.norm, ("rms", "layer")), ("mlp", self.mlp, ("swiglu", "gelu")),
                                 ("position", self.position, ("rope", "learned")),
                                 ("remat", self.remat, REMAT_POLICIES)):
      if value not in allowed:
        raise ValueError(f"LlamaConfig.{name}={value!r}; choose one of {allowed}.")
    if self.position == "rope" and self.dim_head % 2:
      raise ValueError(f"rotary embeddings need an even head_dim, got {self.dim_head}.")

  @property
  def dim_head(self) -> int:
    return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

  @property
  def groups(self) -> int:
    return self.num_heads // self.num_kv_heads

  def replace(self, **changes) -> "LlamaConfig":
    """A copy of the config with the given fields changed (`dataclasses.replace`)."""
    return dataclasses.replace(self, **changes)


def smollm2_135m_config() -> LlamaConfig:
  """SmolLM2-135M (what the GGUF metadata says; HF rotate-half layout after `gguf_io` un-permutes q/k)."""
  return LlamaConfig()


def tiny_config(vocab_size: int = 256, **changes) -> LlamaConfig:
  """A tiny random Llama for tests (2 layers, width 32, 4 query / 2 kv heads)."""
  base = dict(vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
              intermediate_size=64, rope_base=10000.0, max_seq_len=256)
  base.update(changes)
  return LlamaConfig(**base)


def gpt2_config(vocab_size: int = 50257, hidden_size: int = 768, num_layers: int = 12, num_heads: int = 12,
                max_seq_len: int = 1024, **changes) -> LlamaConfig:
  """GPT-2 style: LayerNorm, learned positions, GELU MLP (4x), biases, tied head, full multi-head attention.

  Args:
    vocab_size: V (50257 for the GPT-2 tokenizer).
    hidden_size: D (768 for GPT-2 small).
    num_layers: transformer blocks.
    num_heads: attention heads (also the kv heads: no grouped-query attention).
    max_seq_len: number of learned positions.
    **changes: any other LlamaConfig field, overriding the GPT-2 defaults.

  Returns:
    LlamaConfig.
  """
  base = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
              num_kv_heads=num_heads, intermediate_size=4 * hidden_size, norm="layer", mlp="gelu",
              position="learned", use_bias=True, norm_eps=1e-5, max_seq_len=max_seq_len, tie_embeddings=True)
  base.update(changes)
  return LlamaConfig(**base)


# Llama-2 shapes (Touvron et al., 2023, Table 1; the released config.json files of meta-llama/Llama-2-{7b,13b,70b}-hf:
# vocab 32000, rms_norm_eps 1e-5, rope_theta 10000, 4096 positions, untied lm_head; 70B uses 8 key/value heads).
LLAMA2_SHAPES = {
    "7b": dict(hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32, intermediate_size=11008),
    "13b": dict(hidden_size=5120, num_layers=40, num_heads=40, num_kv_heads=40, intermediate_size=13824),
    "70b": dict(hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, intermediate_size=28672),
}


def llama2_config(size: str, **changes) -> LlamaConfig:
  """The Llama-2 architecture at one of its released sizes, in the stacked (scanned) layer form.

  Args:
    size: '7b', '13b' or '70b' (the chat models share the shapes).
    **changes: any other LlamaConfig field (e.g. remat='full', scan_layers=False).

  Returns:
    LlamaConfig (rotate-half rope as in the Hugging Face checkpoints, `load_safetensors_llama` reads them).

  Raises:
    ValueError: unknown size.
  """
  if size not in LLAMA2_SHAPES:
    raise ValueError(f"unknown Llama-2 size {size!r}; choose one of {sorted(LLAMA2_SHAPES)}.")
  base = dict(vocab_size=32000, rope_base=10000.0, rope_layout="half", norm_eps=1e-5, tie_embeddings=False,
              max_seq_len=4096, scan_layers=True, **LLAMA2_SHAPES[size])
  base.update(changes)
  return LlamaConfig(**base)


# ----------------------------------------------------------------------------------------------- parameters


_dense_init = layers.dense_init


def _norm_init(config: LlamaConfig, dtype):
  p = {"scale": jnp.ones((config.hidden_size,), dtype)}
  if config.norm == "layer":
    p["bias"] = jnp.zeros((config.hidden_size,), dtype)
  return p


def init_params(key: jax.Array, config: LlamaConfig, dtype=jnp.float32) -> Params:
  """Random parameters (normal std 0.02 kernels, unit norms, zero biases; output projections scaled by
  1/sqrt(2 L) as in GPT-2).

  Args:
    key: a typed PRNG key.
    config: the model configuration.
    dtype: parameter dtype.

  Returns:
    The parameter pytree described in the module docstring (stacked layers when config.scan_layers).
  """
  d, h, kv, hd, f = (config.hidden_size, config.num_heads, config.num_kv_heads, config.dim_head,
                     config.intermediate_size)
  out_std = 0.02 / math.sqrt(2 * config.num_layers)
  keys = jax.random.split(key, config.num_layers + 3)
  params: Params = {"embed": (0.02 * jax.random.normal(keys[0], (config.vocab_size, d))).astype(dtype)}
  if config.position == "learned":
    params["pos_embed"] = (0.01 * jax.random.normal(keys[1], (config.max_seq_len, d))).astype(dtype)
  blocks = []
  for i in range(config.num_layers):
    k = jax.random.split(keys[3 + i], 7)
    layer = {"attn_norm": _norm_init(config, dtype),
             "q_proj": _dense_init(k[0], d, h * hd, dtype, config.use_bias),
             "k_proj": _dense_init(k[1], d, kv * hd, dtype, config.use_bias),
             "v_proj": _dense_init(k[2], d, kv * hd, dtype, config.use_bias),
             "o_proj": _dense_init(k[3], h * hd, d, dtype, config.use_bias, std=out_std),
             "mlp_norm": _norm_init(config, dtype),
             "up_proj": _dense_init(k[5], d, f, dtype, config.use_bias),
             "down_proj": _dense_init(k[6], f, d, dtype, config.use_bias, std=out_std)}
    if config.mlp == "swiglu":
      layer["gate_proj"] = _dense_init(k[4], d, f, dtype, config.use_bias)
    blocks.append(layer)
  params["layers"] = blocks
  params["final_norm"] = _norm_init(config, dtype)
  if not config.tie_embeddings:
    params["lm_head"] = _dense_init(keys[2], d, config.vocab_size, dtype, False)
  return stack_layers(params) if config.scan_layers else params


def is_stacked(params: Params) -> bool:
  """Whether `params['layers']` is the stacked form (one dict of [L, ...] leaves) rather than a list."""
  return isinstance(params.get("layers"), dict)


def stack_layers(params: Params) -> Params:
  """The list of per-layer dicts -> one dict whose leaves have a leading [L] axis (for `lax.scan`).

  Args:
    params: parameters with `params['layers']` a list of identically structured dicts (or already stacked).

  Returns:
    A new pytree with `layers` stacked; every other entry is shared, not copied.
  """
  if is_stacked(params):
    return params
  layers_list = params["layers"]
  if not layers_list:
    raise ValueError("stack_layers needs at least one layer.")
  return {**params, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers_list)}


def unstack_layers(params: Params) -> Params:
  """The stacked form -> a list of per-layer dicts (what cached decoding and `fuse_params` iterate over).

  Args:
    params: parameters with `params['layers']` stacked ([L, ...] leaves) or already a list.

  Returns:
    A new pytree with `layers` a list of L dicts.
  """
  if not is_stacked(params):
    return params
  stacked = params["layers"]
  n = jax.tree.leaves(stacked)[0].shape[0]
  return {**params, "layers": [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n)]}


def _concat_dense(parts: list[dict]) -> dict:
  out = {"kernel": jnp.concatenate([p["kernel"] for p in parts], axis=1)}
  if "bias" in parts[0]:
    out["bias"] = jnp.concatenate([p["bias"] for p in parts], axis=0)
  return out


def fuse_params(params: Params) -> Params:
  """Merges q/k/v kernels into one `qkv_proj` and gate/up into `gate_up_proj` (same function, fewer matmuls).

  Args:
    params: canonical parameters (already fused layers are kept as they are).

  Returns:
    A new pytree; `forward` gives the same outputs with it (up to float summation order).
  """
  if is_stacked(params):
    return stack_layers(fuse_params(unstack_layers(params)))
  blocks = []
  for layer in params["layers"]:
    layer = dict(layer)
    if "q_proj" in layer and "kernel" in layer["q_proj"]:
      layer["qkv_proj"] = _concat_dense([layer.pop("q_proj"), layer.pop("k_proj"), layer.pop("v_proj")])
    if "gate_proj" in layer and "kernel" in layer["gate_proj"]:
      layer["gate_up_proj"] = _concat_dense([layer.pop("gate_proj"), layer.pop("up_proj")])
    blocks.append(layer)
  return {**params, "layers": blocks}


def num_params(params: Params) -> int:
  """Total number of scalars in a parameter pytree."""
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


# ------------------------------------------------------------------------------------------------ KV cache


@flax.struct.dataclass
class KVCache:
  """Keys/values of earlier tokens for incremental decoding (a pytree; donate it to update in place).

  Attributes:
    k: per layer [B, KV, hd, S] keys (rotary applied; stored transposed so q @ k needs no copy).
    v: per layer [B, KV, S, hd] values.
    mask: [B, S] bool, which slots hold a real (non-padding) token.
    index: int32 scalar, the next slot to write (all rows advance together).
    length: [B] int32, real tokens seen per row (the next rotary position).
  """

  k: list
  v: list
  mask: jax.Array
  index: jax.Array
  length: jax.Array

  @property
  def max_len(self) -> int:
    return int(self.mask.shape[1])


def init_cache(config: LlamaConfig, batch_size: int, max_len: int, dtype=jnp.float32) -> KVCache:
  """An empty cache with room for `max_len` tokens per row.

  Args:
    config: the model configuration.
    batch_size: rows B.
    max_len: slots S (prompt + generated tokens).
    dtype: dtype of the stored keys/values (the activations' dtype).

  Returns:
    A KVCache of zeros with index 0.
  """
  if max_len > config.max_seq_len:
    raise ValueError(f"cache length {max_len} exceeds config.max_seq_len={config.max_seq_len}; "
                     "shorten the prompt or max_new_tokens.")
  k_shape = (batch_size * config.num_kv_heads, config.dim_head, max_len)
  v_shape = (batch_size * config.num_kv_heads, max_len, config.dim_head)
  return KVCache(k=[jnp.zeros(k_shape, dtype) for _ in range(config.num_layers)],
                 v=[jnp.zeros(v_shape, dtype) for _ in range(config.num_layers)],
                 mask=jnp.zeros((batch_size, max_len), bool), index=jnp.zeros((), jnp.int32),
                 length=jnp.zeros((batch_size,), jnp.int32))


# ------------------------------------------------------------------------------------------------ blocks


_dense = layers.dense


def _norm(p: dict, x: jax.Array, config: LlamaConfig) -> jax.Array:
  if config.norm == "rms":
    return layers.rms_norm(p, x, config.norm_eps)
  return layers.layer_norm(p, x, config.norm_eps)


def rope_tables(positions: jax.Array, head_dim: int, base: float) -> tuple[jax.Array, jax.Array]:
  """cos/sin of the rotary angles.

  Args:
    positions: [B, T] int positions.
    head_dim: per-head width (even).
    base: rotary base theta.

  Returns:
    (cos, sin), each [B, T, 1, head_dim // 2] float32 (broadcast over heads).
  """
  inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
  return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, layout: str) -> jax.Array:
  """Rotates query/key vectors.

  Args:
    x: [B, T, heads, hd].
    cos, sin: [B, T, 1, hd // 2] from `rope_tables`.
    layout: 'half' rotates (x[:hd/2], x[hd/2:]); 'interleaved' rotates (x[2i], x[2i+1]).

  Returns:
    Rotated x, same shape and dtype.
  """
  xf = x.astype(jnp.float32)
  if layout == "half":
    x1, x2 = jnp.split(xf, 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  else:
    pairs = xf.reshape(*xf.shape[:-1], -1, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    out = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(xf.shape)
  return out.astype(x.dtype)


def _qkv(layer: dict, x: jax.Array, config: LlamaConfig):
  h, kv, hd = config.num_heads, config.num_kv_heads, config.dim_head
  b, t = x.shape[:2]
  if "qkv_proj" in layer:
    qkv = _dense(layer["qkv_proj"], x)
    q, k, v = jnp.split(qkv, [h * hd, (h + kv) * hd], axis=-1)
  else:
    q, k, v = _dense(layer["q_proj"], x), _dense(layer["k_proj"], x), _dense(layer["v_proj"], x)
  return q.reshape(b, t, h, hd), k.reshape(b, t, kv, hd), v.reshape(b, t, kv, hd)


def _attention(q, k, v, allowed, config: LlamaConfig):
  """q [B, T, H, hd]; k, v [B, KV, S, hd]; allowed [B, T, S] bool -> [B, T, H * hd]."""
  b, t, h, hd = q.shape
  kv, g = config.num_kv_heads, config.groups
  q = q.reshape(b, t, kv, g, hd).transpose(0, 2, 3, 1, 4)  # [B, KV, G, T, hd]
  scores = jnp.einsum("bkgtd,bksd->bkgts", q, k).astype(jnp.float32) / math.sqrt(hd)
  scores = jnp.where(allowed[:, None, None], scores, _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bksd->bkgtd", probs, v)  # [B, KV, G, T, hd]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h * hd)


def _full_cache_attention(q, k, v, allowed, config):
  """q [B, T, H, hd]; k [B*KV, hd, S]; v [B*KV, S, hd]; allowed [B, T, S] -> [B, T, H * hd].

  The cache's batch and head axes are merged so it feeds the batched matmuls without a reshape (a reshape
  of a freshly updated cache makes XLA:CPU copy the whole cache on every decoding step).
  """
  b, t, h, hd = q.shape
  kv, g = config.num_kv_heads, config.groups
  q = q.reshape(b, t, kv, g, hd).transpose(0, 2, 3, 1, 4).reshape(b * kv, g * t, hd)
  scores = jnp.einsum("nqd,nds->nqs", q, k).astype(jnp.float32) / math.sqrt(hd)  # [B*KV, G*T, S]
  allowed = jnp.broadcast_to(jnp.tile(allowed, (1, g, 1))[:, None], (b, kv, g * t, allowed.shape[-1]))
  scores = jnp.where(allowed.reshape(b * kv, g * t, -1), scores, _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("nqs,nsd->nqd", probs, v)  # [B*KV, G*T, hd]
  return out.reshape(b, kv, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, h * hd)


def _mlp(layer: dict, x: jax.Array, config: LlamaConfig) -> jax.Array:
  if config.mlp == "gelu":
    return _dense(layer["down_proj"], jax.nn.gelu(_dense(layer["up_proj"], x), approximate=True))
  if "gate_up_proj" in layer:
    gate, up = jnp.split(_dense(layer["gate_up_proj"], x), 2, axis=-1)
  else:
    gate, up = _dense(layer["gate_proj"], x), _dense(layer["up_proj"], x)
  return _dense(layer["down_proj"], jax.nn.silu(gate) * up)


def embed_tokens(params: Params, ids: jax.Array) -> jax.Array:
  """Token embeddings [..., D] (float table, a `quant.convert_params` table, or `quantize_params`' int8 one).

  Args:
    params: LM params holding 'embed' [V, D], 'embed_bf16' [V, D], 'embed_int8' [V, D] with
      'embed_scale_int8' [V, D // group], or 'embed_q' int8 [V, D] with 'embed_scale' [V].
    ids: int token ids of any shape [...], values in [0, V).

  Returns:
    [..., D] embeddings in the table's dtype (float32 for the compact and quantised tables).
  """
  rows = quant.embed_lookup(params, ids)
  if rows is not None:
    return rows
  if "embed_q" in params:
    return (jnp.take(params["embed_q"], ids, axis=0).astype(jnp.float32)
            * jnp.take(params["embed_scale"], ids, axis=0)[..., None])
  return jnp.take(params["embed"], ids, axis=0)


def param_dtype(params: Params):
  """The dtype activations run in (the float embedding table's; float32 for converted or quantised params)."""
  return params["embed"].dtype if "embed" in params else jnp.float32


def quantize_params(params: Params, quantize_head: bool = True) -> Params:
  """Weight-only int8 storage + dynamic int8 activations for every dense layer and the tied head.

  Each kernel W [in, out] becomes `qkernel` = int8 rows of W^T [out, in] with one float32 scale per
  output (`qscale`), and the embedding table `embed_q` [V, D] with a scale per token (it doubles as the
  tied output head). Weights take a quarter of the float32 memory (SmolLM2: 0.14 GB instead of 0.54 GB)
  and matmuls read a quarter of the bytes. Measured on the 2-core CPU of this project, XLA:CPU's int8 matmul
  and the activation quantisation cost more than the bytes saved (batch-1 decoding ~0.85x, prompt
  processing several times slower), so float32 stays the default; this is for memory-bound settings.
  Outputs change by the rounding: on SmolLM2 the mean log-likelihood of a long
  paragraph moves from -2.95 to -3.01 nats/token (-2.98 with `quantize_head=False`), and greedy answers
  can differ after a few tokens. Norms and biases stay float32. Apply after `fuse_params` (it also
  accepts canonical params).

  Args:
    params: float parameters.
    quantize_head: also quantise the embedding table / tied output head (21% of SmolLM2's bytes).

  Returns:
    A new pytree that `forward` / `generate` accept (not for training).
  """
  params = unstack_layers(params)  # quantised params serve cached decoding: the list form

  def q_dense(p):
    if not isinstance(p, dict) or "kernel" not in p:
      return p
    qk, qs = layers.quantize_rows(p["kernel"].T)
    out = {k: v for k, v in p.items() if k != "kernel"}
    out.update(qkernel=qk, qscale=qs)
    return out

  out = {k: v for k, v in params.items() if k not in ("embed", "layers", "lm_head")}
  if quantize_head:
    out["embed_q"], out["embed_scale"] = layers.quantize_rows(params["embed"])
  else:
    out["embed"] = params["embed"]
  if "lm_head" in params:
    out["lm_head"] = q_dense(params["lm_head"]) if quantize_head else params["lm_head"]
  out["layers"] = [{k: q_dense(v) for k, v in layer.items()} for layer in params["layers"]]
  return out


def output_logits(params: Params, config: LlamaConfig, hidden: jax.Array) -> jax.Array:
  """Logits from final (normed) hidden states [..., D] -> [..., V] (tied or untied head).

  Args:
    params: LM params (the tied table 'embed' / 'embed_bf16' / 'embed_int8' / 'embed_q', or 'lm_head' when
      config.tie_embeddings is False).
    config: LlamaConfig (its tie_embeddings selects the head).
    hidden: [..., D] final normed hidden states.

  Returns:
    logits [..., V].
  """
  if config.tie_embeddings:
    logits = quant.head_logits(params, hidden)
    if logits is not None:
      return logits
    if "embed_q" in params:
      return layers.int8_matmul(hidden, params["embed_q"], params["embed_scale"])
    return hidden @ params["embed"].T
  return _dense(params["lm_head"], hidden)


def _layer_block(layer: dict, x: jax.Array, cos, sin, allowed: jax.Array, config: LlamaConfig) -> jax.Array:
  """One transformer block without a cache: x [B, T, D] -> [B, T, D] (attention among the T tokens)."""
  hn = _norm(layer["attn_norm"], x, config)
  q, k, v = _qkv(layer, hn, config)
  if cos is not None:
    q = apply_rope(q, cos, sin, config.rope_layout)
    k = apply_rope(k, cos, sin, config.rope_layout)
  att = _attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), allowed, config)
  x = x + _dense(layer["o_proj"], att)
  return x + _mlp(layer, _norm(layer["mlp_norm"], x, config), config)


def _remat_policy(config: LlamaConfig):
  return {"full": jax.checkpoint_policies.nothing_saveable,
          "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[config.remat]


def _trunk_hidden_states(params: Params, config: LlamaConfig, ids: jax.Array, mask: jax.Array,
                         last_only: bool) -> jax.Array:
  """`hidden_states` without a cache for the stacked (scanned) and/or rematerialised forms."""
  b, t = ids.shape
  positions = jnp.maximum(jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1, 0)
  x = constrain_batch(embed_tokens(params, ids))
  if config.position == "learned":
    x = x + jnp.take(params["pos_embed"], jnp.minimum(positions, config.max_seq_len - 1), axis=0)
    cos = sin = None
  else:
    cos, sin = rope_tables(positions, config.dim_head, config.rope_base)
  allowed = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :]

  def block(x, layer):
    return constrain_batch(_layer_block(layer, x, cos, sin, allowed, config))

  if config.remat != "none":
    # Inside a scan the loop already keeps XLA from merging the recomputation away (MaxText: prevent_cse=False).
    block = jax.checkpoint(block, policy=_remat_policy(config), prevent_cse=not is_stacked(params))
  if is_stacked(params):
    x, _ = jax.lax.scan(lambda carry, layer: (block(carry, layer), None), x, params["layers"])
  else:
    for layer in params["layers"]:
      x = block(x, layer)
  if last_only:
    last = jnp.max(jnp.where(mask, jnp.arange(t, dtype=jnp.int32)[None], 0), axis=1)  # [B]
    x = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
  return _norm(params["final_norm"], x, config)


def _check_inputs(ids, mask, config):
  if ids.ndim != 2:
    raise ValueError(f"ids must be [batch, time] token ids, got shape {ids.shape}.")
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f"ids must be integer token ids, got dtype {ids.dtype}.")
  if mask is not None and mask.shape != ids.shape:
    raise ValueError(f"mask shape {mask.shape} does not match ids shape {ids.shape}.")


def hidden_states(params: Params, config: LlamaConfig, ids: jax.Array, mask: jax.Array | None = None,
                  cache: KVCache | None = None, last_only: bool = False):
  """The transformer trunk: final normed hidden states (see `forward` for the arguments).

  Args:
    params: parameter pytree (canonical or `fuse_params` / `quantize_params` form).
    config: the model configuration.
    ids: [B, T] int token ids.
    mask: [B, T] bool/int, 1 for real tokens (default all ones).
    cache: optional KVCache the T new tokens are written into.
    last_only: keep only each row's last real token.

  Returns:
    hidden [B, T, D] (or [B, D] when last_only), and the updated cache when `cache` is given.

  Raises:
    ValueError: ids not [B, T] integers, mask of another shape, or a cache with stacked layers.
  """
  _check_inputs(ids, mask, config)
  b, t = ids.shape
  mask = jnp.ones((b, t), bool) if mask is None else mask.astype(bool)
  if is_stacked(params) and cache is not None:
    raise ValueError("cached decoding needs the list form of the layers: pass unstack_layers(params).")
  if cache is None and (is_stacked(params) or config.remat != "none"):  # remat only matters for gradients
    return _trunk_hidden_states(params, config, ids, mask, last_only)
  offset = cache.length[:, None] if cache is not None else 0
  positions = offset + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1
  positions = jnp.maximum(positions, 0)

  x = embed_tokens(params, ids)
  if config.position == "learned":
    x = x + jnp.take(params["pos_embed"], jnp.minimum(positions, config.max_seq_len - 1), axis=0)
    cos = sin = None
  else:
    cos, sin = rope_tables(positions, config.dim_head, config.rope_base)

  causal = jnp.tril(jnp.ones((t, t), bool))
  allowed = causal[None] & mask[:, None, :]  # [B, T, T] among the new tokens
  if cache is not None:
    slot_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, cache.index))
    slots = jnp.arange(cache.max_len)
    query_slot = cache.index + jnp.arange(t)
    allowed_full = (slots[None, :] <= query_slot[:, None])[None] & slot_mask[:, None, :]
  new_k, new_v = [], []
  for i, layer in enumerate(params["layers"]):
    hn = _norm(layer["attn_norm"], x, config)
    q, k, v = _qkv(layer, hn, config)
    if cos is not None:
      q = apply_rope(q, cos, sin, config.rope_layout)
      k = apply_rope(k, cos, sin, config.rope_layout)
    k = k.transpose(0, 2, 1, 3)  # [B, KV, T, hd]
    v = v.transpose(0, 2, 1, 3)
    if cache is None:
      att = _attention(q, k, v, allowed, config)
    else:
      kv_rows = b * config.num_kv_heads
      k_full = jax.lax.dynamic_update_slice(
          cache.k[i], k.transpose(0, 1, 3, 2).reshape(kv_rows, -1, t).astype(cache.k[i].dtype), (0, 0, cache.index))
      v_full = jax.lax.dynamic_update_slice(
          cache.v[i], v.reshape(kv_rows, t, -1).astype(cache.v[i].dtype), (0, cache.index, 0))
      new_k.append(k_full)
      new_v.append(v_full)
      att = _full_cache_attention(q, k_full, v_full, allowed_full, config)
    x = x + _dense(layer["o_proj"], att)
    x = x + _mlp(layer, _norm(layer["mlp_norm"], x, config), config)
  if last_only:
    last = jnp.max(jnp.where(mask, jnp.arange(t, dtype=jnp.int32)[None], 0), axis=1)  # [B]
    x = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
  hidden = _norm(params["final_norm"], x, config)
  if cache is None:
    return hidden
  return hidden, KVCache(k=new_k, v=new_v, mask=slot_mask, index=cache.index + t,
                         length=cache.length + jnp.sum(mask, axis=1, dtype=jnp.int32))


def forward(params: Params, config: LlamaConfig, ids: jax.Array, mask: jax.Array | None = None,
            cache: KVCache | None = None, last_only: bool = False, return_hidden: bool = False):
  """Runs the LM.

  Padding may be on either side: rotary (or learned) positions count only real tokens
  (`cumsum(mask) - 1`), and padded keys are never attended to, so the outputs at real tokens do not
  depend on padding. Outputs at padded positions are meaningless.

  Args:
    params: parameter pytree (canonical or `fuse_params` form).
    config: the model configuration.
    ids: [B, T] int token ids.
    mask: [B, T] bool/int, 1 for real tokens (default all ones).
    cache: optional KVCache; the T new tokens are written at slots [index, index + T) and attend to
      every earlier real slot. Without a cache attention is causal within `ids`.
    last_only: return logits at each row's last real token only ([B, V]); skips the other T - 1 output
      projections (prefill). With left padding that is position T - 1.
    return_hidden: also return the final normed hidden states.

  Returns:
    logits [B, T, V] (or [B, V] when last_only) in float32; then the updated cache if `cache` was
    given; then hidden [B, T, D] (or [B, D]) if `return_hidden`.
  """
  out = hidden_states(params, config, ids, mask, cache=cache, last_only=last_only)
  hidden, new_cache = (out if cache is not None else (out, None))
  logits = output_logits(params, config, hidden).astype(jnp.float32)
  outs = [logits]
  if cache is not None:
    outs.append(new_cache)
  if return_hidden:
    outs.append(hidden)
  return outs[0] if len(outs) == 1 else tuple(outs)
