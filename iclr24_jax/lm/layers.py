"""Shared building blocks of the LM family (pure functions on parameter dicts).

A dense layer's parameters are `{'kernel': [in, out], 'bias'?: [out]}`; a LoRA adapter attached with
`lora.apply` adds `lora_a [in, r]`, `lora_b [r, out]` and `lora_scale` (alpha / r) to the same dict, and
every model of the family goes through `dense`, so LoRA works on Llama, GPT-2, T5 and BERT alike.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from iclr24_jax.lm import quant


def dense(p: dict, x: jax.Array) -> jax.Array:
  """y = x @ kernel (+ (x @ lora_a) @ lora_b * lora_scale) (+ bias).

  Args:
    p: {'kernel': [in, out], optional 'bias': [out], optional LoRA fields}; or a compact kernel from
      `quant.convert_params` ('kernel_bf16' / 'kernel_int8' + 'scale_int8', [out, in]) or
      `llama.quantize_params` ('qkernel' + 'qscale').
    x: [..., in].

  Returns:
    [..., out].
  """
  if quant.is_compact(p):
    y = quant.matmul_t(x, p)
  elif "qkernel" in p:
    y = int8_matmul(x, p["qkernel"], p["qscale"])
  else:
    y = x @ p["kernel"]
  if "lora_a" in p:
    y = y + ((x @ p["lora_a"]) @ p["lora_b"]) * p["lora_scale"]
  if "bias" in p:
    y = y + p["bias"]
  return y


def quantize_rows(w: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Symmetric per-row int8 quantisation: w [R, C] -> (q int8 [R, C], scale float32 [R]), w ~ q * scale."""
  w = w.astype(jnp.float32)
  scale = jnp.max(jnp.abs(w), axis=1) / 127.0
  scale = jnp.where(scale > 0, scale, 1.0)
  return jnp.clip(jnp.round(w / scale[:, None]), -127, 127).astype(jnp.int8), scale


def int8_matmul(x: jax.Array, qkernel: jax.Array, qscale: jax.Array) -> jax.Array:
  """x @ W with W stored as int8 rows of W^T (`qkernel [out, in]`, `qscale [out]`), activations quantised
  to int8 per row on the fly (dynamic W8A8, as llama.cpp pairs Q8 activations with quantised weights).

  Args:
    x: [..., in] float.
    qkernel: [out, in] int8.
    qscale: [out] float32.

  Returns:
    [..., out] in x's dtype. The int8 x int8 -> int32 product reads 4x fewer weight bytes than float32.
  """
  lead = x.shape[:-1]
  xf = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  xs = jnp.max(jnp.abs(xf), axis=1, keepdims=True) / 127.0
  xs = jnp.where(xs > 0, xs, 1.0)
  xq = jnp.clip(jnp.round(xf / xs), -127, 127).astype(jnp.int8)
  acc = jax.lax.dot_general(xq, qkernel, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)
  y = acc.astype(jnp.float32) * xs * qscale
  return y.reshape(*lead, -1).astype(x.dtype)


def rms_norm(p: dict, x: jax.Array, eps: float) -> jax.Array:
  """x / rms(x) * scale, computed in float32 (Llama RMSNorm; T5's LayerNorm is the same).

  Args:
    p: {'scale': [D]}.
    x: [..., D] activations (any float dtype).
    eps: added to mean(x^2) before the inverse square root.

  Returns:
    [..., D] in x's dtype.
  """
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return (y * p["scale"]).astype(x.dtype)


def layer_norm(p: dict, x: jax.Array, eps: float) -> jax.Array:
  """Standard LayerNorm with scale and bias, computed in float32.

  Args:
    p: {'scale': [D], 'bias': [D]}.
    x: [..., D] activations (any float dtype).
    eps: added to the variance before the inverse square root.

  Returns:
    [..., D] in x's dtype.
  """
  xf = x.astype(jnp.float32)
  mu = jnp.mean(xf, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
  y = (xf - mu) * jax.lax.rsqrt(var + eps)
  return (y * p["scale"] + p["bias"]).astype(x.dtype)


def dense_init(key: jax.Array, d_in: int, d_out: int, dtype=jnp.float32, bias: bool = False,
               std: float = 0.02) -> dict:
  """Normal(0, std) kernel [d_in, d_out] and optional zero bias.

  Args:
    key: PRNG key.
    d_in: input width.
    d_out: output width.
    dtype: parameter dtype (the kernel is drawn in float32, then cast).
    bias: add a zero 'bias' [d_out].
    std: kernel standard deviation.

  Returns:
    {'kernel': [d_in, d_out]} (plus 'bias': [d_out]).
  """
  p = {"kernel": (std * jax.random.normal(key, (d_in, d_out), jnp.float32)).astype(dtype)}
  if bias:
    p["bias"] = jnp.zeros((d_out,), dtype)
  return p
