"""Causal-LM finetuning (`lm/train.py`): the loss of a uniform model, a train step lowers the loss,
the loss mask, the token KL by hand, at LoRA init and for full finetuning."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.lm import llama, train
from .helpers import CFG, LCFG, _batch


def test_loss_of_uniform_model_is_log_vocab():
  """All-zero weights give zero logits, so every token costs log V: 64 tokens -> log 64 = 4.1589."""
  zero = jax.tree.map(jnp.zeros_like, llama.init_params(jax.random.key(0), CFG))
  loss, metrics = jax.jit(train.causal_lm_loss, static_argnums=1)(zero, CFG, _batch())
  np.testing.assert_allclose(float(loss), math.log(64), atol=1e-4)
  # batch: 4 rows x 12 tokens, row 1 has 9 real tokens; the first token of each row is not predicted:
  # 11 + 8 + 11 + 11 = 41 target tokens
  assert float(metrics["tokens"]) == 41.0


@pytest.mark.parametrize("use_lora", [False, True])
def test_train_step_lowers_loss(params, use_lora):
  chex.clear_trace_counter()  # the two parametrizations build distinct closures of the same code
  batch = _batch()
  tx = optax.adam(1e-2)
  lcfg = LCFG if use_lora else None
  state = train.init_train_state(params, tx, lora_config=lcfg, key=jax.random.key(2))
  step = jax.jit(chex.assert_max_traces(train.make_train_step(CFG, lcfg), n=1))
  losses = []
  for i in range(8):
    state, metrics = step(state, batch, jax.random.key(i))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0] - 0.1, losses
  if use_lora:
    # the base weights are untouched; only the adapters moved
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state.extra["base"], params)
    assert float(jnp.abs(state.params["layers/0/q_proj"]["b"]).max()) > 0
    merged = train.model_params(state, lcfg)
    assert merged["layers"][0]["q_proj"]["kernel"].shape == params["layers"][0]["q_proj"]["kernel"].shape


def test_loss_mask_selects_targets(params):
  """With loss_mask on the last 3 tokens only, the loss equals the mean NLL of those tokens."""
  batch = _batch(b=2, t=8)
  batch["mask"][:] = True
  loss_mask = np.zeros((2, 8), bool)
  loss_mask[:, 5:] = True
  both = jax.jit(lambda p, b: (train.causal_lm_loss(p, CFG, b)[0], llama.forward(p, CFG, b["ids"])))
  loss, logits = both(params, {**batch, "loss_mask": loss_mask})
  logits = np.asarray(logits, np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = -np.mean([logp[b, t - 1, batch["ids"][b, t]] for b in range(2) for t in range(5, 8)])
  np.testing.assert_allclose(float(loss), want, atol=1e-4)


def test_token_kl_by_hand():
  """pi = (1/2, 1/2), pi_ref = (1/4, 3/4): KL = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3) = 0.1438410; equal -> 0;
  invariant to a constant shift of either logit vector."""
  logits = jnp.log(jnp.asarray([[0.5, 0.5], [0.3, 0.7]]))
  ref = jnp.log(jnp.asarray([[0.25, 0.75], [0.3, 0.7]])) + 5.0
  kl = np.asarray(train.token_kl(logits, ref))
  np.testing.assert_allclose(kl[0], 0.5 * math.log(4 / 3), rtol=1e-6)
  assert abs(kl[1]) < 1e-7
  with pytest.raises(ValueError, match="same shape"):
    train.token_kl(logits, ref[:, :1])


def test_kl_is_zero_at_lora_init_and_positive_after_one_step(params):
  """LoRA: the frozen base is the reference policy. With B = 0 the policy is the base, so KL(pi || pi_ref) is
  exactly 0 (no second copy of the weights is made); one step later it is positive, and the loss is
  NLL + beta * KL."""
  chex.clear_trace_counter()
  batch = _batch()
  loss_fn = train.kl_regularized_loss(beta=0.1)
  state = train.init_train_state(params, optax.adam(1e-2), lora_config=LCFG, key=jax.random.key(2))
  assert "reference" not in state.extra  # the base is reused, not copied
  step = jax.jit(chex.assert_max_traces(train.make_train_step(CFG, LCFG, loss_fn=loss_fn), n=1))
  ev = jax.jit(train.make_eval_step(CFG, LCFG, loss_fn=loss_fn))
  m0 = ev(state, batch)
  assert float(m0["kl"]) == 0.0
  nll0 = float(jax.jit(train.causal_lm_loss, static_argnums=1)(params, CFG, batch)[0])
  np.testing.assert_allclose(float(m0["nll"]), nll0, rtol=1e-6)
  np.testing.assert_allclose(float(m0["loss"]), nll0, rtol=1e-6)
  state, m_step = step(state, batch, jax.random.key(0))
  assert float(m_step["kl"]) == 0.0  # the step's own forward ran at the initial adapters
  m1 = ev(state, batch)
  assert float(m1["kl"]) > 1e-6, m1
  np.testing.assert_allclose(float(m1["loss"]), float(m1["nll"]) + 0.1 * float(m1["kl"]), rtol=1e-6)
  state, _ = step(state, batch, jax.random.key(1))  # no retrace


def test_kl_reference_for_full_finetuning(params):
  """Full finetuning keeps a frozen copy only when asked; without it a KL loss says how to get one."""
  loss_fn = train.kl_regularized_loss(beta=1.0)
  batch = _batch()
  with pytest.raises(ValueError, match="keep_reference=True"):
    train.make_train_step(CFG, loss_fn=loss_fn)(train.init_train_state(params, optax.sgd(0.1)), batch, None)
  state = train.init_train_state(params, optax.sgd(0.5), keep_reference=True)
  step = jax.jit(train.make_train_step(CFG, loss_fn=loss_fn))
  state, m0 = step(state, batch, jax.random.key(0))
  assert float(m0["kl"]) == 0.0
  _, m1 = step(state, batch, jax.random.key(1))
  assert float(m1["kl"]) > 0.0
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               state.extra["reference"], params)
  assert not train.wants_reference(train.causal_lm_loss)  # old losses keep their 3-argument call
  assert train.wants_reference(loss_fn)
