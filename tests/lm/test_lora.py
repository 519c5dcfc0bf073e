"""LoRA (`lm/lora.py`): zero B equals the base model, merge equals apply, errors."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.lm import llama, lora
from .helpers import CFG, LCFG, _batch


def test_lora_zero_b_equals_base_and_merge_equals_apply(params):
  adapters = lora.init_params(jax.random.key(1), params, LCFG)
  assert set(adapters) == {f"layers/{i}/{n}" for i in range(CFG.num_layers) for n in ("q_proj", "v_proj", "down_proj")}
  a = adapters["layers/0/q_proj"]
  chex.assert_shape((a["a"], a["b"]), ((CFG.hidden_size, 4), (4, CFG.num_heads * CFG.dim_head)))
  # rank*(in+out) per target: q (32+32), v (32+16), down (64+32) -> 4*(64+48+96)=832 per layer, 2 layers
  assert lora.num_params(adapters) == 2 * 4 * (64 + 48 + 96)
  ids = jnp.asarray(_batch()["ids"])

  @jax.jit
  def outs(p, ad):
    return (llama.forward(p, CFG, ids), llama.forward(lora.apply(p, ad, LCFG), CFG, ids),
            llama.forward(lora.merge(p, ad, LCFG), CFG, ids))

  base, applied, merged = outs(params, adapters)
  np.testing.assert_allclose(np.asarray(applied), np.asarray(base), rtol=1e-6, atol=1e-6)  # B = 0
  nonzero = jax.tree.map(lambda x: x + 0.05, adapters)
  base, applied, merged = outs(params, nonzero)
  assert np.abs(np.asarray(applied) - np.asarray(base)).max() > 1e-3
  np.testing.assert_allclose(np.asarray(merged), np.asarray(applied), rtol=1e-5, atol=1e-5)
  # merge adds (alpha / r) A B to the kernel
  m = lora.merge(params, nonzero, LCFG)
  ab = nonzero["layers/1/v_proj"]
  np.testing.assert_allclose(np.asarray(m["layers"][1]["v_proj"]["kernel"]),
                             np.asarray(params["layers"][1]["v_proj"]["kernel"] + 2.0 * ab["a"] @ ab["b"]),
                             rtol=1e-6, atol=1e-6)


def test_lora_errors(params):
  with pytest.raises(ValueError, match="no dense layer named"):
    lora.init_params(jax.random.key(0), params, lora.LoraConfig(targets=("query",)))
  with pytest.raises(ValueError, match="fused"):
    lora.init_params(jax.random.key(0), llama.fuse_params(params), lora.LoraConfig(targets=("q_proj",)))
  with pytest.raises(ValueError, match="rank"):
    lora.LoraConfig(rank=0)
