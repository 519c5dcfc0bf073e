"""Shared building blocks of the LM family (pure functions on parameter dicts).

A dense layer's parameters are `{'kernel': [in, out], 'bias'?: [out]}`; a LoRA adapter attached with
`lora.apply` adds `lora_a [in, r]`, `lora_b [r, out]` and `lora_scale` (alpha / r) to the same dict, and
every model of the family goes through `dense`, so LoRA works on Llama, GPT-2, T5 and BERT alike.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def dense(p: dict, x: jax.Array) -> jax.Array:
  """y = x @ kernel (+ (x @ lora_a) @ lora_b * lora_scale) (+ bias).

  Args:
    p: {'kernel': [in, out], optional 'bias': [out], optional LoRA fields}.
    x: [..., in].

  Returns:
    [..., out].
  """
  y = x @ p["kernel"]
  if "lora_a" in p:
    y = y + ((x @ p["lora_a"]) @ p["lora_b"]) * p["lora_scale"]
  if "bias" in p:
    y = y + p["bias"]
  return y


def rms_norm(p: dict, x: jax.Array, eps: float) -> jax.Array:
  """x / rms(x) * scale, computed in float32 (Llama RMSNorm; T5's LayerNorm is the same)."""
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return (y * p["scale"]).astype(x.dtype)


def layer_norm(p: dict, x: jax.Array, eps: float) -> jax.Array:
  """Standard LayerNorm with scale and bias, computed in float32."""
  xf = x.astype(jnp.float32)
  mu = jnp.mean(xf, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
  y = (xf - mu) * jax.lax.rsqrt(var + eps)
  return (y * p["scale"] + p["bias"]).astype(x.dtype)


def dense_init(key: jax.Array, d_in: int, d_out: int, dtype=jnp.float32, bias: bool = False,
               std: float = 0.02) -> dict:
  """Normal(0, std) kernel [d_in, d_out] and optional zero bias."""
  p = {"kernel": (std * jax.random.normal(key, (d_in, d_out), jnp.float32)).astype(dtype)}
  if bias:
    p["bias"] = jnp.zeros((d_out,), dtype)
  return p
