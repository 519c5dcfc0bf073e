"""Inference weight formats for the decoder-only LM: float32 (reference), bfloat16, group-wise int8.

A decoding step at batch 1 reads every weight once per token, so its speed is set by the bytes of weights
read (SmolLM2-135M: 538 MB per token in float32, 269 MB in bfloat16, 152 MB in int8 with float32 group
scales). `convert_params` rewrites every dense kernel (and the tied embedding / output head) of a
`llama` parameter pytree into one of these formats; `llama.forward`, `generation.generate`, `Generator`
and the scoring functions accept the result unchanged:

  fast = quant.convert_params(llama.fuse_params(params), "int8")
  out = generation.generate(fast, config, ids, mask, key, max_new_tokens=64)

Formats (kernels are stored transposed, [out, in], so each output is a contiguous dot over the input):
  'float32'   the parameters as they are (the reference numerics).
  'bfloat16'  `kernel_bf16` [out, in] bfloat16 (half the bytes).
  'int8'      `kernel_int8` [out, in] uint8 codes with one float32 scale and minimum per output and group of
              `group_size` consecutive inputs, `scale_int8` / `min_int8` [out, in // group_size]
              (affine, w ~ q * scale + minimum); the tied table `embed_int8` int8 with `embed_scale_int8`
              (symmetric, w ~ q * scale, llama.cpp's Q8_0).
  'int8_a16'  the same codes under `kernel_a16` / `scale_a16` / `min_a16` (`embed_a16`, `embed_scale_a16`),
              multiplied by activations rounded to 16-bit integers per row and group of 32 inputs (two int8
              codes each): exact integer group dots in the native CPU kernel `native.q8_matmul` (AVX-512 VNNI;
              its XLA reference elsewhere). The fastest format for decoding on the CPU (lm README); groups of 32.
In 'float32', 'bfloat16' and 'int8', activations, norms, rotary embeddings, attention, the KV cache and logits
stay float32: these are weight-storage formats, not low-precision arithmetic. 'int8_a16' also rounds the
activations entering each matmul, in steps of 1/32512 of their group's largest magnitude (norms, attention, the
cache and logits stay float32); SmolLM2's per-token log-probabilities move by 0.001 nats on the test paragraph.
One int8 code per activation (llama.cpp's Q8 activations) moved them by 0.12 nats there, hence the second code.

How the matmul runs (measured on XLA:CPU, 2 AVX-512 cores; see the lm README):
  one row (batch-1 decoding): the int8 -> float32 (or bfloat16 -> float32) conversion and the group
    scales are fused into XLA's vector-matrix dot, so only the compact weights cross the memory bus.
  several rows (prefill, batched decoding, scoring): the weights are widened to bfloat16 and multiplied
    in bfloat16 with float32 accumulation (activations are rounded to bfloat16 there).
  'int8_a16', any number of rows: the native kernel reads the 8-bit codes once per call and shares each
    load among up to eight rows (`native.q8_matmul`).

Deviation: int8 here is weight-only with group scales (like llama.cpp's Q8_0 weights, 32 per group),
not W8A8. Per-row int8 weights with per-token int8 activations (`llama.quantize_params`, kept for
memory-bound settings) moved SmolLM2's log-probabilities by 0.2 nats per token on a paragraph, ten times
the 0.02 this format is tested against, and was not faster here than the fused weight-only dot.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.lm import native

Params = dict[str, Any]

WEIGHT_FORMATS = ("float32", "bfloat16", "int8", "int8_a16")
DEFAULT_GROUP_SIZE = 32  # llama.cpp's Q8_0 / Q4_1 block length; SmolLM2's widths (576, 1536) are multiples


def _check_format(weight_format: str) -> None:
  if weight_format not in WEIGHT_FORMATS:
    raise ValueError(f"weight_format={weight_format!r}; choose one of {WEIGHT_FORMATS}.")


def quantize_groups(w_t: jax.Array, group_size: int = DEFAULT_GROUP_SIZE, affine: bool = False
                    ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """8-bit codes with one scale (and, if affine, one minimum) per row and group of consecutive columns.

  Symmetric: q int8 in [-127, 127], w ~ q * scale, scale = max|w| / 127 (llama.cpp's Q8_0 layout: a Q8_0
  table is reproduced exactly). Affine: q uint8 in [0, 255], w ~ q * scale + minimum, scale = (max - min)
  / 255 (a Q4_1 block, m + k d with k in 0..15, is reproduced exactly: 255 = 15 x 17).

  Args:
    w_t: [R, C] float matrix (a kernel transposed to [out, in]).
    group_size: columns per scale; must divide C.
    affine: store a per-group minimum (uint8 codes) instead of symmetric int8 codes.

  Returns:
    (q [R, C] int8 or uint8, scale float32 [R, G], minimum float32 [R, G] or None), G = C // group_size;
    |w - dequantized| <= scale / 2 elementwise.

  Raises:
    ValueError: w_t is not 2-D, or group_size does not divide its column count.
  """
  if w_t.ndim != 2:
    raise ValueError(f"quantize_groups expects a 2-D [out, in] matrix, got shape {w_t.shape}.")
  r, c = w_t.shape
  if group_size < 1 or c % group_size:
    raise ValueError(f"group_size={group_size} must divide the input width {c}; pick a divisor of {c} "
                     f"(e.g. {math.gcd(c, DEFAULT_GROUP_SIZE)}).")
  blocks = jnp.asarray(w_t, jnp.float32).reshape(r, c // group_size, group_size)
  if affine:
    lo, hi = jnp.min(blocks, axis=-1), jnp.max(blocks, axis=-1)
    scale = (hi - lo) / 255.0
    scale = jnp.where(scale > 0, scale, 1.0)  # a constant group stores zeros and its value as the minimum
    q = jnp.clip(jnp.round((blocks - lo[..., None]) / scale[..., None]), 0, 255).astype(jnp.uint8)
    return q.reshape(r, c), scale, lo
  scale = jnp.max(jnp.abs(blocks), axis=-1) / 127.0
  scale = jnp.where(scale > 0, scale, 1.0)  # an all-zero group stores zeros with scale 1
  q = jnp.clip(jnp.round(blocks / scale[..., None]), -127, 127).astype(jnp.int8)
  return q.reshape(r, c), scale, None


def dequantize_groups(q: jax.Array, scale: jax.Array, minimum: jax.Array | None = None,
                      dtype=jnp.float32) -> jax.Array:
  """Widens 8-bit codes back to weights: q * scale (+ minimum), each scale covering C // G columns.

  Args:
    q: [R, C] int8 or uint8 codes.
    scale: [R, G] float scales.
    minimum: [R, G] float minimums (affine codes) or None (symmetric).
    dtype: output dtype.

  Returns:
    [R, C] weights in `dtype`.
  """
  r, c = q.shape
  g = scale.shape[-1]
  w = q.reshape(r, g, c // g).astype(jnp.float32) * scale[..., None].astype(jnp.float32)
  if minimum is not None:
    w = w + minimum[..., None].astype(jnp.float32)
  return w.reshape(r, c).astype(dtype)


def _stored_t(p: dict, dtype) -> jax.Array:
  """The [out, in] kernel of a converted dense dict, widened to `dtype` (fused into the consumer)."""
  if "kernel_int8" in p:
    return dequantize_groups(p["kernel_int8"], p["scale_int8"], p.get("min_int8"), dtype)
  return p["kernel_bf16"].astype(dtype)


def _materialized(v: jax.Array) -> jax.Array:
  """v itself (exactly), computed by a reduction so XLA:CPU does not fuse v's producers into the dot below.

  XLA:CPU fuses the vector-matrix dot with its operands' elementwise producers and would then recompute the
  vector (a norm, the SwiGLU product, the embedding gather) once per output: SmolLM2's int8 decoding step
  took 28 ms of CPU that way and 15.5 ms with the vector computed once (an optimization barrier does not
  help: it is removed before fusion). Reductions are not fused into consumers.
  """
  return jnp.sum(jnp.stack([v, jnp.zeros_like(v)]), axis=0)


def matmul_t(x: jax.Array, p: dict) -> jax.Array:
  """x @ W for a dense dict in a compact format (`kernel_bf16`, or `kernel_int8` + `scale_int8`).

  One row: a float32 vector-matrix dot whose weight conversion XLA fuses into the dot, so only the compact
  weights are read. Several rows: bfloat16 x bfloat16 with float32 accumulation. 'int8_a16' kernels: the
  native kernel (8-bit codes x 16-bit integer activations) at any number of rows (`native.q8_matmul`).

  Args:
    x: [..., in] float activations.
    p: {'kernel_bf16': [out, in]}, {'kernel_int8': [out, in], 'scale_int8': [out, G] (, 'min_int8')} or
      {'kernel_a16': [out, in], 'scale_a16': [out, G] (, 'min_a16')}.

  Returns:
    [..., out] in x's dtype.
  """
  lead = x.shape[:-1]
  rows = math.prod(lead)
  if "kernel_a16" in p:
    y = native.q8_matmul(x.reshape(rows, -1), p["kernel_a16"], p["scale_a16"], p.get("min_a16"))
    return y.reshape(*lead, -1).astype(x.dtype)
  if rows == 1:
    w = _stored_t(p, jnp.float32)
    # The barrier keeps the vector's producers (norms, activations) out of the fused dot: XLA:CPU's fused
    # vector-matrix dot would recompute them once per output (measured 10x slower decoding steps).
    v = _materialized(x.reshape(-1).astype(jnp.float32))
    y = jax.lax.dot_general(v, w, (((0,), (1,)), ((), ())))
  else:
    w = _stored_t(p, jnp.bfloat16)
    y = jax.lax.dot_general(x.reshape(rows, -1).astype(jnp.bfloat16), w, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
  return y.reshape(*lead, -1).astype(x.dtype)


def is_compact(p: Any) -> bool:
  """Whether a dense dict holds a `convert_params` kernel (bfloat16, int8 or int8_a16).

  Args:
    p: any pytree node.

  Returns:
    bool.
  """
  return isinstance(p, dict) and ("kernel_bf16" in p or "kernel_int8" in p or "kernel_a16" in p)


def _convert_dense(p: Any, weight_format: str, group_size: int) -> Any:
  if not isinstance(p, dict) or "kernel" not in p:
    return p
  if "lora_a" in p:
    raise ValueError("convert_params got a dense layer with a LoRA adapter; merge it first (lora.merge).")
  out = {k: v for k, v in p.items() if k != "kernel"}
  w_t = jnp.asarray(p["kernel"]).T
  if weight_format == "bfloat16":
    out["kernel_bf16"] = w_t.astype(jnp.bfloat16)
  else:
    tag = _TAGS[weight_format]
    out[f"kernel_{tag}"], out[f"scale_{tag}"], out[f"min_{tag}"] = quantize_groups(w_t, group_size, affine=True)
  return out


_TAGS = {"int8": "int8", "int8_a16": "a16"}  # key suffix of each 8-bit format's arrays


def convert_params(params: Params, weight_format: str, group_size: int = DEFAULT_GROUP_SIZE,
                   include_head: bool = True) -> Params:
  """Stores a `llama` parameter pytree's dense kernels (and its embedding / tied head) in a compact format.

  Args:
    params: float parameters, canonical or `llama.fuse_params` form (fuse first: fewer, larger dots).
    weight_format: 'float32' (returned unchanged), 'bfloat16' or 'int8' (see the module docstring).
    group_size: int8 only: inputs per scale (divides every kernel's input width and the model width).
    include_head: also convert the embedding table, which is SmolLM2's tied output head (21% of its bytes).

  Returns:
    A new pytree for `llama.forward` / `generation.generate` / scoring (inference only: not for training).
    Norms and biases stay float32.

  Raises:
    ValueError: unknown format, a group size that does not divide a width, params already converted
      or quantised, or a LoRA adapter still attached.
  """
  _check_format(weight_format)
  if weight_format == "float32":
    return params
  if weight_format == "int8_a16" and group_size != native.GROUP:
    raise ValueError(f"weight_format='int8_a16' runs the native kernel, whose groups are {native.GROUP} inputs; "
                     f"got group_size={group_size} (use 'int8' for other group sizes).")
  if not isinstance(params["layers"], list):
    raise ValueError("convert_params expects the list layer form; call llama.unstack_layers(params) first "
                     "(the stacked form serves training and scoring, compact formats serve decoding).")
  if "embed" not in params or any(is_compact(v) or (isinstance(v, dict) and "qkernel" in v)
                                  for layer in params["layers"] for v in layer.values()):
    raise ValueError("convert_params expects float parameters (an 'embed' table and float kernels); these "
                     "are already converted or quantised. Convert the original float parameters.")
  out = {k: v for k, v in params.items() if k not in ("embed", "layers", "lm_head")}
  out["layers"] = [{k: _convert_dense(v, weight_format, group_size) for k, v in layer.items()}
                   for layer in params["layers"]]
  embed = jnp.asarray(params["embed"])
  if not include_head:
    out["embed"] = embed
  elif weight_format == "bfloat16":
    out["embed_bf16"] = embed.astype(jnp.bfloat16)
  else:
    tag = _TAGS[weight_format]
    out[f"embed_{tag}"], out[f"embed_scale_{tag}"], _ = quantize_groups(embed, group_size)
  if "lm_head" in params:
    out["lm_head"] = _convert_dense(params["lm_head"], weight_format, group_size) if include_head \
        else params["lm_head"]
  return out


def weight_format(params: Params) -> str:
  """'float32', 'bfloat16', 'int8', 'int8_a16' (`convert_params`), 'w8a8' (`llama.quantize_params`) or the table's
  dtype.

  Args:
    params: a `llama` parameter pytree.

  Returns:
    The format name of its first layer's kernels.
  """
  layers = params["layers"]
  layer = layers[0] if isinstance(layers, list) else layers
  for v in layer.values():
    if isinstance(v, dict):
      if "kernel_int8" in v:
        return "int8"
      if "kernel_a16" in v:
        return "int8_a16"
      if "kernel_bf16" in v:
        return "bfloat16"
      if "qkernel" in v:
        return "w8a8"
      if "kernel" in v:
        return str(jnp.dtype(v["kernel"].dtype))
  return "float32"


def embed_lookup(params: Params, ids: jax.Array) -> jax.Array | None:
  """Rows of a converted embedding table.

  Args:
    params: a `llama` pytree.
    ids: [...] int token ids.

  Returns:
    [..., D] float32 rows, or None when the table is not converted.
  """
  tag = "int8" if "embed_int8" in params else "a16" if "embed_a16" in params else None
  if tag:
    q = jnp.take(params[f"embed_{tag}"], ids, axis=0)                 # [..., D]
    s = jnp.take(params[f"embed_scale_{tag}"], ids, axis=0)           # [..., G]
    g = s.shape[-1]
    w = q.reshape(*q.shape[:-1], g, -1).astype(jnp.float32) * s[..., None]
    return w.reshape(q.shape)
  if "embed_bf16" in params:
    return jnp.take(params["embed_bf16"], ids, axis=0).astype(jnp.float32)
  return None


def head_logits(params: Params, hidden: jax.Array) -> jax.Array | None:
  """Tied-head logits from a converted table (or the [D, V] copy of `batched_decoding_params`).

  Args:
    params: a `llama` pytree.
    hidden: [..., D] final normed hidden states.

  Returns:
    [..., V] float32 logits, or None when the table is not converted.
  """
  if "head_t" in params:
    return hidden.astype(jnp.float32) @ params["head_t"]
  if "embed_int8" in params:
    return matmul_t(hidden, {"kernel_int8": params["embed_int8"], "scale_int8": params["embed_scale_int8"]})
  if "embed_a16" in params:
    return matmul_t(hidden, {"kernel_a16": params["embed_a16"], "scale_a16": params["embed_scale_a16"]})
  if "embed_bf16" in params:
    return matmul_t(hidden, {"kernel_bf16": params["embed_bf16"]})
  return None


def weight_bytes(params: Params, include_embedding_lookup: bool = False) -> int:
  """Bytes of weights one decoding step reads: every kernel, norm, bias and the output head.

  Args:
    params: a `llama` pytree in any format.
    include_embedding_lookup: count an untied model's input table too (a step reads one row of it).

  Returns:
    int bytes (a tied table counts once, as the head).
  """
  total = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = jax.tree_util.keystr(path)
    if "pos_embed" in name:
      continue  # one row per step
    if not include_embedding_lookup and "lm_head" in params and "embed" in name and "lm_head" not in name:
      continue
    total += int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
  return total


def batched_decoding_params(params: Params) -> Params:
  """The weights laid out for decoding several rows per step; call it once per `generate`, outside the loop.

  Two layouts are slow on XLA:CPU when a step multiplies several rows (measured on SmolLM2, batch 8, 2 cores;
  see the lm README) and are rewritten here:
    - the tied head `hidden @ embed.T`: XLA:CPU ran this [8, 576] x [49152, 576]^T float32 GEMM in 50-90 ms
      (B = 32 cost the same: the time goes to handling the 113 MB table, not to the rows), against ~16 ms for
      the same product with the table stored [D, V]. `head_t` is that float32 [D, V] copy (made from the
      float32, bfloat16 or int8 table), which `head_logits` then uses; it is also faster than the bfloat16
      table's own GEMM at B = 8 (23-39 ms).
    - int8 kernels: at several rows `matmul_t` widens the codes to bfloat16 before the GEMM, and XLA:CPU
      materialises that copy on every step (205 ms of op time in a 240 ms step at B = 8). Widening once here,
      before the loop, leaves a bfloat16 GEMM per step.
  Float32 and bfloat16 kernels are kept as they are. The copies cost memory for as long as the call that
  makes them runs (one float32 table and a bfloat16 copy of the int8 kernels: 113 + 214 MB for SmolLM2) and
  one pass over the weights per call; batch-1 decoding does not call this and keeps the compact weights
  (their widening fused into each one-row dot, see `bind_to_step`).

  Args:
    params: a `llama` pytree in the list layer form (any `convert_params` format, fused or not).

  Returns:
    The same pytree with `head_t` (float32 [D, V]) for a tied head and int8 kernels replaced by
    `kernel_bf16`; params quantised by `llama.quantize_params` or in the stacked form are returned unchanged.
  """
  if not isinstance(params.get("layers"), list) or "embed_q" in params or weight_format(params) == "int8_a16":
    return params  # 'int8_a16': the native kernel shares each read of the codes among the rows as they are

  def widen(p):
    if isinstance(p, dict) and "kernel_int8" in p:
      out = {k: v for k, v in p.items() if k not in ("kernel_int8", "scale_int8", "min_int8")}
      out["kernel_bf16"] = _stored_t(p, jnp.bfloat16)
      return out
    return p

  out = {**params, "layers": [{k: widen(v) for k, v in layer.items()} for layer in params["layers"]]}
  if "lm_head" in params:
    out["lm_head"] = widen(params["lm_head"])
  else:
    if "embed_int8" in params:
      table = dequantize_groups(params["embed_int8"], params["embed_scale_int8"])
    elif "embed_bf16" in params:
      table = params["embed_bf16"].astype(jnp.float32)
    else:
      table = params["embed"].astype(jnp.float32)
    out["head_t"] = table.T
  return out


def bind_to_step(params: Params, step: jax.Array) -> Params:
  """The same parameters, with every compact kernel's widening made to depend on a loop counter.

  Inside `lax.while_loop` XLA hoists loop-invariant work out of the loop: the int8 -> float32 widening of
  every weight would run once before the loop and the loop would then read 4x the bytes from a float32 copy
  (measured: a SmolLM2 decoding step 4x slower than float32). Adding a step-dependent 0 to the int8 codes
  (or to the bit patterns of bfloat16 kernels) keeps the widening fused into each step's dot, where it
  belongs. Float32 parameters are returned unchanged.

  Args:
    params: a `llama` pytree (any format).
    step: int32 scalar that varies across loop iterations (>= 0).

  Returns:
    A pytree with the same values (exactly: the factor is 1.0) and structure.
  """
  if not isinstance(params["layers"], list):
    return params  # the stacked (scanned) form: float only (convert_params refuses it)
  zero = (step < 0)

  def codes(q):
    return q + zero.astype(q.dtype)

  def bits(w):  # bfloat16: add the zero to its bit pattern (XLA:CPU computes bfloat16 arithmetic in float32)
    return jax.lax.bitcast_convert_type(codes(jax.lax.bitcast_convert_type(w, jnp.uint16)), jnp.bfloat16)

  def bind(p):
    if not isinstance(p, dict):
      return p
    if "kernel_int8" in p:
      return {**p, "kernel_int8": codes(p["kernel_int8"])}
    if "kernel_bf16" in p:
      return {**p, "kernel_bf16": bits(p["kernel_bf16"])}
    return p

  out = {k: v for k, v in params.items() if k != "layers"}
  out["layers"] = [{k: bind(v) for k, v in layer.items()} for layer in params["layers"]]
  if "embed_int8" in params:
    out["embed_int8"] = codes(params["embed_int8"])
  if "embed_bf16" in params:
    out["embed_bf16"] = bits(params["embed_bf16"])
  if "lm_head" in params:
    out["lm_head"] = bind(params["lm_head"])
  return out
