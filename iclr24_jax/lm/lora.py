"""LoRA adapters (Hu et al., 2022) for any model of the family, on parameter pytrees.

A target is a dense layer `{'kernel': [in, out], ...}` whose name (the dict key) is in `targets`, e.g.
('q_proj', 'v_proj') for Llama, ('q', 'v') for T5, ('query', 'value') for BERT. Adapter parameters are a
flat dict `{'layers/3/q_proj': {'a': [in, r], 'b': [r, out]}}`; `b` starts at zero so the adapted model
equals the base model at initialisation.

  lora_params = lora.init_params(key, params, LoraConfig(rank=8, alpha=16, targets=('q_proj', 'v_proj')))
  logits = llama.forward(lora.apply(params, lora_params, cfg), config, ids)   # W x + (x A) B * alpha/r
  merged = lora.merge(params, lora_params, cfg)                               # W + A B * alpha/r, same outputs

Train only `lora_params` (the base params are an argument the gradient does not flow into); see
`train.make_train_step(..., lora_config=...)`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """LoRA hyper-parameters.

  Attributes:
    rank: r, the adapter rank.
    alpha: scaling numerator; the update is (alpha / r) * A @ B.
    targets: names of the dense layers to adapt (dict keys in the params pytree).
  """

  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = ("q_proj", "v_proj")

  def __post_init__(self):
    if self.rank < 1:
      raise ValueError(f"LoRA rank must be >= 1, got {self.rank}.")
    object.__setattr__(self, "targets", tuple(self.targets))

  @property
  def scale(self) -> float:
    return float(self.alpha) / float(self.rank)


def _walk(node: Any, path: tuple[str, ...], out: dict):
  if isinstance(node, dict):
    if "kernel" in node and path:
      out["/".join(path)] = node
    for k, v in node.items():
      if isinstance(v, (dict, list, tuple)):
        _walk(v, path + (str(k),), out)
  elif isinstance(node, (list, tuple)):
    for i, v in enumerate(node):
      _walk(v, path + (str(i),), out)


def target_paths(params: Any, targets: Sequence[str]) -> list[str]:
  """Paths ('layers/0/q_proj') of the dense layers whose name is in `targets`.

  A dense layer is any dict holding a 'kernel'; its name is the last path component.

  Args:
    params: the base model's params pytree (nested dicts / lists).
    targets: layer names to adapt, e.g. ('q_proj', 'v_proj').

  Returns:
    list of '/'-joined paths, in traversal order.

  Raises:
    ValueError: when nothing matches, listing the dense layer names that exist.
  """
  found: dict[str, Any] = {}
  _walk(params, (), found)
  paths = [p for p in found if p.split("/")[-1] in set(targets)]
  if not paths:
    names = sorted({p.split("/")[-1] for p in found})
    hint = (" (params are fused: use 'qkv_proj' / 'gate_up_proj', or adapt the unfused params)"
            if "qkv_proj" in names else "")
    raise ValueError(f"no dense layer named {list(targets)} in the params; available: {names}{hint}.")
  return paths


def init_params(key: jax.Array, params: Any, config: LoraConfig, dtype=jnp.float32) -> dict[str, dict[str, jax.Array]]:
  """Adapter parameters for every targeted dense layer.

  A ~ Kaiming-uniform (bound 1/sqrt(in), as peft does), B = 0.

  Args:
    key: PRNG key.
    params: the base model's params.
    config: LoraConfig.
    dtype: adapter dtype.

  Returns:
    {path: {'a': [in, r], 'b': [r, out]}}.
  """
  found: dict[str, Any] = {}
  _walk(params, (), found)
  out = {}
  for i, path in enumerate(target_paths(params, config.targets)):
    d_in, d_out = found[path]["kernel"].shape
    bound = 1.0 / math.sqrt(d_in)
    a = jax.random.uniform(jax.random.fold_in(key, i), (d_in, config.rank), jnp.float32, -bound, bound)
    out[path] = {"a": a.astype(dtype), "b": jnp.zeros((config.rank, d_out), dtype)}
  return out


def _map_targets(params: Any, lora_params: dict, fn: Callable[[dict, dict], dict]) -> Any:
  def rec(node, path):
    if isinstance(node, dict):
      key = "/".join(path)
      new = {k: rec(v, path + (str(k),)) if isinstance(v, (dict, list, tuple)) else v for k, v in node.items()}
      if key in lora_params and "kernel" in node:
        new = fn(new, lora_params[key])
      return new
    if isinstance(node, (list, tuple)):
      return type(node)(rec(v, path + (str(i),)) for i, v in enumerate(node))
    return node

  missing = set(lora_params)
  found: dict[str, Any] = {}
  _walk(params, (), found)
  missing -= set(found)
  if missing:
    raise ValueError(f"LoRA params target layers missing from the model: {sorted(missing)[:5]}.")
  return rec(params, ())


def merge(params: Any, lora_params: dict, config: LoraConfig) -> Any:
  """Base params with each targeted kernel replaced by W + (alpha / r) A B (a plain model again).

  Args:
    params: the base model's params; each targeted 'kernel' is [in, out].
    lora_params: {path: {'a': [in, r], 'b': [r, out]}} from `init_params`.
    config: LoraConfig (its scale = alpha / r).

  Returns:
    params of the same structure, targeted kernels [in, out] in their original dtype.

  Raises:
    ValueError: a lora_params path is not a dense layer of params.
  """
  def fn(p, ab):
    return {**p, "kernel": (p["kernel"] + config.scale * (ab["a"] @ ab["b"])).astype(p["kernel"].dtype)}
  return _map_targets(params, lora_params, fn)


def apply(params: Any, lora_params: dict, config: LoraConfig) -> Any:
  """Base params with the adapters attached unmerged (`layers.dense` computes x W + (x A) B * alpha / r).

  Cheaper than `merge` inside a train step when kernels are large; same outputs up to rounding.

  Args:
    params: the base model's params.
    lora_params: {path: {'a': [in, r], 'b': [r, out]}} from `init_params`.
    config: LoraConfig (its scale = alpha / r).

  Returns:
    params where each targeted layer dict also holds 'lora_a' [in, r], 'lora_b' [r, out] and a scalar
    'lora_scale' (the adapters' dtype).

  Raises:
    ValueError: a lora_params path is not a dense layer of params.
  """
  def fn(p, ab):
    return {**p, "lora_a": ab["a"], "lora_b": ab["b"], "lora_scale": jnp.asarray(config.scale, ab["a"].dtype)}
  return _map_targets(params, lora_params, fn)


def num_params(lora_params: dict) -> int:
  """Number of trainable adapter scalars."""
  return int(sum(x.size for x in jax.tree.leaves(lora_params)))
