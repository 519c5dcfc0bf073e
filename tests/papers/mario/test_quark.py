"""MARIO's Quark (`papers/mario/quark.py`): the KL term by hand, the T5 and Llama losses with codes, a step learns a
fixed batch, clear errors."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.lm import llama, t5
from iclr24_jax.lm import train as lm_train
from iclr24_jax.papers import mario
from .helpers import CFG, _coded_batch


def test_kl_zero_when_policy_equals_reference(params, tok):
  _, _, _, plain = _coded_batch(tok, False)
  plain = dict(plain, code_mask=np.zeros_like(plain["mask"]))
  loss, m = jax.jit(lambda p, b: mario.quark_loss(p, CFG, b, p, kl_coef=0.1, entropy_coef=0.05))(params, plain)
  assert float(m["kl"]) == pytest.approx(0.0, abs=1e-6)
  np.testing.assert_allclose(float(loss), float(m["nll"]) - 0.05 * float(m["entropy"]), rtol=1e-6)
  # a random tiny model is near-uniform: entropy close to log V
  assert 0.9 * math.log(CFG.vocab_size) < float(m["entropy"]) <= math.log(CFG.vocab_size) + 1e-4
  # with codes the policy sees context the reference does not: KL > 0 even for equal weights
  _, _, _, coded = _coded_batch(tok, True)
  _, m2 = jax.jit(lambda p, b: mario.quark_loss(p, CFG, b, p))(params, coded)
  assert float(m2["kl"]) > 0


def test_kl_hand_computed_on_tiny_distributions(params, tok):
  # pi = [0.8, 0.1, 0.1], pi_ref = [0.4, 0.4, 0.2]:
  # KL(pi || pi_ref) = 0.8 ln 2 + 0.1 ln(1/4) + 0.1 ln(1/2) = 0.554518 - 0.138629 - 0.069315 = 0.346574
  # (the reverse KL(pi_ref || pi) = -0.277259 + 0.554518 + 0.138629 = 0.415888 would be the wrong direction)
  logits = jnp.log(jnp.array([[0.8, 0.1, 0.1], [0.4, 0.4, 0.2]]))
  ref = jnp.log(jnp.array([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2]])) + 3.0      # logits: a constant shift changes nothing
  np.testing.assert_allclose(lm_train.token_kl(logits, ref), [0.346574, 0.0], rtol=1e-5, atol=1e-6)
  # quark_loss's 'kl' is that per-token KL averaged over the response tokens: recompute it in numpy from the
  # policy's (with codes) and the reference's (codes masked) logits of the same rows
  _, _, _, coded = _coded_batch(tok, True)
  ref_params = jax.tree.map(lambda x: x * 0.9, params)
  _, m = jax.jit(lambda p, r, b: mario.quark_loss(p, CFG, b, r))(params, ref_params, coded)
  f = jax.jit(lambda p, b: lm_train.causal_target_logits(p, CFG, b))
  lp, _, w = f(params, {k: coded[k] for k in ("ids", "mask", "loss_mask")})
  lr, _, _ = f(ref_params, {"ids": coded["ids"], "mask": coded["mask"] & ~coded["code_mask"],
                            "loss_mask": coded["loss_mask"]})

  def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))

  log_p, log_r = log_softmax(lp), log_softmax(lr)
  kl_tok = np.sum(np.exp(log_p) * (log_p - log_r), -1)
  w = np.asarray(w, np.float64)
  np.testing.assert_allclose(float(m["kl"]), np.sum(kl_tok * w) / np.sum(w), rtol=1e-4)


def test_t5_quark_loss_and_decoder_prefix():
  cfg = t5.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2, eos_id=2)
  p = t5.init_params(jax.random.key(0), cfg)
  rng = np.random.default_rng(0)
  resp = rng.integers(3, 64, (2, 6)).astype(np.int32)
  codes = np.array([[10, 11], [12, 13]], np.int32)
  base = {"inputs": rng.integers(3, 64, (2, 5)).astype(np.int32), "input_mask": np.ones((2, 5), bool),
          "ref_labels": resp, "ref_label_mask": np.ones((2, 6), bool)}
  no_codes = dict(base, labels=resp, label_mask=np.ones((2, 6), bool), loss_mask=np.ones((2, 6), bool))
  _, m = jax.jit(lambda q, b: mario.quark_loss(q, cfg, b, q))(p, no_codes)
  assert float(m["kl"]) == pytest.approx(0.0, abs=1e-6)
  coded = dict(base, labels=np.concatenate([codes, resp], 1), label_mask=np.ones((2, 8), bool),
               loss_mask=np.concatenate([np.zeros((2, 2), bool), np.ones((2, 6), bool)], 1))
  _, m = jax.jit(lambda q, b: mario.quark_loss(q, cfg, b, q))(p, coded)
  assert float(m["tokens"]) == 12.0 and float(m["kl"]) > 0
  out = jax.jit(lambda q, i, msk, c, k: mario.sample(k, q, cfg, i, msk, c, max_new_tokens=4, temperature=0.0))(
      p, base["inputs"], base["input_mask"], codes, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out.tokens[:, :2]), codes)  # the codes right after the start token


def test_llama_sample_continues_after_codes(params, tok):
  codes = mario.ControlCodes.from_tokenizer(tok)
  ids, mask = mario.encode_prompts(tok, ["Can a cat swim?", "Is the sun a planet?"], 32)
  c = np.asarray([mario.control_prefix(codes.best(), codes)] * 2, np.int32)
  out = jax.jit(lambda p, i, m, cc, k: mario.sample(k, p, CFG, i, m, cc, max_new_tokens=3, temperature=0.0))(
      params, ids, mask, c, jax.random.key(0))
  full = np.concatenate([ids, c], 1)
  fmask = np.concatenate([mask, np.ones_like(c, bool)], 1)
  first = np.argmax(np.asarray(llama.forward(params, CFG, full, fmask, last_only=True)), -1)
  np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), first)  # greedy token after prompt + codes
  with pytest.raises(ValueError, match="codes must be"):
    mario.sample(jax.random.key(0), params, CFG, ids, mask, c[:1], max_new_tokens=2)


def test_quark_step_learns_fixed_batch(params, tok):
  """Full finetuning (the reference is the kept copy): the response NLL of 4 fixed rows falls."""
  chex.clear_trace_counter()
  _, _, _, batch = _coded_batch(tok)
  state = lm_train.init_train_state(params, optax.adam(3e-3), keep_reference=True)
  step = jax.jit(chex.assert_max_traces(mario.make_quark_step(CFG, None, kl_coef=0.1, entropy_coef=0.0), n=1))
  losses = []
  for i in range(12):
    state, m = step(state, batch, jax.random.key(i))
    losses.append(float(m["nll"]))
  assert losses[-1] < 0.8 * losses[0], losses
  assert float(m["kl"]) > 0  # moved away from the reference


def test_encode_examples_errors(tok):
  with pytest.raises(ValueError, match="same number"):
    mario.encode_examples(tok, ["a", "b"], ["x", "y"], [[1], [1, 2]])
  with pytest.raises(ValueError, match="no room"):
    mario.encode_examples(tok, ["a long question " * 10], ["x"], None, max_len=8)
