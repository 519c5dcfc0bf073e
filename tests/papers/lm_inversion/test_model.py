"""lm_inversion's model (`papers/lm_inversion/model.py`): unroll shapes and padding, the unigram EMA
by hand, top-k access (vec2text's rule), a learning train step compiled once, the vmapped multi
step and the sample inverter (slow), the distribution check's errors."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.lm import t5
from iclr24_jax.papers import lm_inversion as li


def test_unroll_shapes_padding_and_unigram():
  # V = 10 log-probabilities -1, -2, ... (sub-normalised rows, as top-k access gives, are valid inputs)
  lp = -1.0 - jnp.arange(20, dtype=jnp.float32).reshape(2, 10)
  uni = jnp.full((10,), 1.0)
  x = li.unroll(lp, uni, width=4)                           # ceil(10/4) = 3 chunks, 2 zeros of padding
  chex.assert_shape(x, (2, 3, 4))
  np.testing.assert_array_equal(x[0].ravel()[:10], -2.0 - np.arange(10))   # lp - unigram = -1 - i - 1
  np.testing.assert_array_equal(x[:, 2, 2:], 0.0)
  # V = 8, d = 4: ours 2 chunks; the official padding adds a whole zero chunk (d - ((V + d) % d) = 4 zeros)
  assert li.num_chunks(8, 4) == 2 and li.num_chunks(8, 4, official_padding=True) == 3
  xo = li.unroll(jnp.full((1, 8), -3.0), jnp.zeros(8), 4, official_padding=True)
  chex.assert_shape(xo, (1, 3, 4))
  np.testing.assert_array_equal(xo[0, 2], 0.0)
  assert li.num_chunks(10, 4, official_padding=True) == 3  # when d does not divide V both agree
  with pytest.raises(ValueError, match=r"\[\.\.\., V\]"):
    li.unroll(jnp.float32(-1.0), uni, 4)
  # per-row: a single [V] row unrolls to [S, d], the same as its row of the batch (so vmap over rows composes)
  np.testing.assert_array_equal(li.unroll(lp[1], uni, 4), x[1])
  with pytest.raises(ValueError, match="unigram"):
    li.unroll(lp, jnp.ones(9), 4)


def test_unigram_ema_hand_computed():
  # u = 0.99 * [1, 2] + 0.01 * mean([[-3, -5], [-5, -7]]) = [0.99 - 0.04, 1.98 - 0.06] = [0.95, 1.92]
  u = li.update_unigram(jnp.array([1.0, 2.0]), jnp.array([[-3.0, -5.0], [-5.0, -7.0]]))
  np.testing.assert_allclose(u, [0.95, 1.92], rtol=1e-6)


def test_topk_access_is_vec2texts_rule_after_the_unigram():
  """vec2text's zero_embedding_except_topk(embeddings - unigram, k, default_val=-30): every entry -30, the k largest
  -30 + their value (scatter_add onto the fill), the padded tail -30; with a per-row traced k (0 = full)."""
  lp = jnp.log(jnp.array([[0.5, 0.1, 0.3, 0.1, 0.0 + 1e-9], [0.25, 0.25, 0.4, 0.05, 0.05]]))
  uni = jnp.array([-0.5, -3.0, -0.2, -2.0, -1.0])
  x = np.asarray(lp - uni[None], np.float64)
  out = np.asarray(li.topk_access(lp - uni[None], 2))
  for row in range(2):
    want = np.full(5, -30.0)
    top = np.argsort(-x[row])[:2]                       # the top 2 AFTER subtracting the unigram
    want[top] = -30.0 + x[row, top]
    np.testing.assert_allclose(out[row], want, rtol=1e-6)
  # row 0: lp - u = [log .5 + .5, log .1 + 3, log .3 + .2, log .1 + 2, ...] = [-0.193, 0.697, -1.004, -0.303, ...]:
  # tokens 1 and 0 are kept, though token 2 has the second-largest raw log-probability; token 0's kept value
  # -30.193 lies below the fill (the official shift by -30 does that to every negative kept value)
  np.testing.assert_array_equal(np.nonzero(out[0] != -30)[0], [0, 1])
  assert out[0, 0] < -30.0
  # unroll applies it after the unigram and pads with the fill (width 4: 5 -> 8 entries)
  un = np.asarray(li.unroll(lp, uni, 4, topk=2)).reshape(2, 8)
  np.testing.assert_allclose(un[:, :5], out, rtol=1e-6)
  np.testing.assert_array_equal(un[:, 5:], -30.0)
  # a traced per-row k with a static bound: row 0 top-1, row 1 the full distribution (zero padding)
  mixed = np.asarray(jax.jit(lambda k: li.unroll(lp, uni, 4, topk=k, topk_max=2))(jnp.array([1, 0]))).reshape(2, 8)
  np.testing.assert_allclose(mixed[0, :5], np.where(np.arange(5) == 1, -30.0 + x[0, 1], -30.0), rtol=1e-6)
  np.testing.assert_allclose(mixed[1], np.concatenate([x[1], np.zeros(3)]), rtol=1e-6)
  with pytest.raises(ValueError, match="k must be"):
    li.topk_access(lp, 6)
  with pytest.raises(ValueError, match="static k_max"):
    li.topk_access(lp, jnp.array(2))


def _tiny_inverter(v=40, width=8):
  cfg = t5.T5Config(vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, pad_id=0, eos_id=2,
                    decoder_start_id=0)
  return li.Inverter(cfg, width, li.num_chunks(v, width), bottleneck=16)


def test_train_step_lowers_loss_and_compiles_once():
  import optax
  inv = _tiny_inverter()
  rng = np.random.default_rng(0)
  logprobs = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(8, 40)) * 3), -1))
  labels = rng.integers(3, 32, size=(8, 6)).astype(np.int32)
  labels[:, -1] = 2
  batch = {"logprobs": jnp.asarray(logprobs), "labels": jnp.asarray(labels), "label_mask": jnp.ones((8, 6), bool)}
  state = li.init(jax.random.key(0), inv, optax.adam(1e-2), 40)
  step = jax.jit(chex.assert_max_traces(li.make_train_step(inv), n=1))
  losses = []
  for _ in range(40):
    state, m = step(state, batch, jax.random.key(1))
    losses.append(float(m["loss"]))
  assert losses[-1] < 0.5 * losses[0], losses
  # the unigram estimate moved towards the batch mean: after k steps u = (1 - 0.99^k) mean
  np.testing.assert_allclose(state.extra["unigram"], (1 - 0.99 ** 40) * logprobs.mean(0), rtol=1e-4, atol=1e-5)
  out = li.invert(state.params, batch["logprobs"], state.extra["unigram"], inverter=inv, max_len=6)
  chex.assert_shape(out.tokens, (8, 6))
  # the fixed batch was memorised: greedy inversion reproduces most label tokens
  assert float(np.mean(np.asarray(out.tokens) == labels)) > 0.5


@pytest.mark.slow  # ~20-35 CPU-s (compiles of the vmapped and single steps)
def test_multi_train_step_equals_separate_steps():
  """M models vmapped in one step give each model exactly its own single-model step (key fold_in(key, m))."""
  import optax
  inv = _tiny_inverter()
  rng = np.random.default_rng(1)
  lp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(4, 2, 40)) * 2), -1))  # [B, M, V]
  labels = rng.integers(3, 32, size=(4, 2, 5)).astype(np.int32)
  batch = {"logprobs": jnp.asarray(lp), "labels": jnp.asarray(labels), "label_mask": jnp.ones((4, 2, 5), bool)}
  tx = optax.adam(1e-2)
  keys = jnp.stack([jax.random.key_data(jax.random.key(s)) for s in (3, 4)])
  states = jax.vmap(lambda k: li.init(jax.random.wrap_key_data(k), inv, tx, 40))(keys)
  step = li.make_train_step(inv)
  new, m = jax.jit(li.make_multi_train_step(step, 2))(states, batch, jax.random.key(7))
  for i in range(2):
    one = jax.tree.map(lambda x: x[i], states)
    ref, mi = step(one, jax.tree.map(lambda x: x[:, i], batch), jax.random.fold_in(jax.random.key(7), i))
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[i], new.params), ref.params, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(new.extra["unigram"][i], ref.extra["unigram"], rtol=1e-6)
    np.testing.assert_allclose(m[f"loss_m{i}"], mi["loss"], rtol=1e-5)
  np.testing.assert_allclose(m["loss"], (m["loss_m0"] + m["loss_m1"]) / 2, rtol=1e-6)


@pytest.mark.slow  # ~20 CPU-s (60 steps and a greedy decode)
def test_sample_inverter_memorises_a_batch():
  """The sample-inversion T5 (text in, prompt out) learns a fixed batch; greedy decoding returns its labels."""
  import optax
  cfg = _tiny_inverter().t5_config
  rng = np.random.default_rng(2)
  inputs = rng.integers(3, 32, size=(8, 7)).astype(np.int32)
  labels = rng.integers(3, 32, size=(8, 5)).astype(np.int32)
  labels[:, -1] = 2
  batch = {"inputs": jnp.asarray(inputs), "input_mask": jnp.ones((8, 7), bool), "labels": jnp.asarray(labels),
           "label_mask": jnp.ones((8, 5), bool)}
  state = li.init_sample_state(jax.random.key(0), cfg, optax.adam(1e-2))
  step = jax.jit(li.make_sample_train_step(cfg))
  first = None
  for _ in range(60):
    state, m = step(state, batch, jax.random.key(1))
    first = float(m["loss"]) if first is None else first
  assert float(m["loss"]) < 0.3 * first, (first, float(m["loss"]))
  out = li.invert_samples(state.params, batch["inputs"], batch["input_mask"], t5_config=cfg, max_len=5)
  chex.assert_shape(out.tokens, (8, 5))
  assert float(np.mean(np.asarray(out.tokens) == labels)) > 0.8


def test_distribution_check_names_the_problem():
  from iclr24_jax.papers.lm_inversion.model import check_distributions
  with pytest.raises(ValueError, match="log_softmax"):
    check_distributions(np.zeros((2, 5), np.float32))
  with pytest.raises(ValueError, match="non-finite"):
    check_distributions(np.full((2, 5), -np.inf, np.float32))        # no mass at all: not a distribution
  with pytest.raises(ValueError, match=r"NaN or \+inf"):
    check_distributions(np.array([[0.0, np.nan]], np.float32))
  check_distributions(np.log(np.full((2, 5), 0.2, np.float32)))
  # a masked / top-k row (-inf entries, less than all the mass) is a valid input
  check_distributions(np.array([[np.log(0.5), np.log(0.3), -np.inf, -np.inf, -np.inf]], np.float32))
