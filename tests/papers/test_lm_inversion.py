"""lm_inversion: unrolling, the unigram EMA, top-k access, metrics on hand-worked examples, a learning train step,
the baselines, and a smoke run of the tiny config."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import data as data_lib
from iclr24_jax.configs import lm_inversion as cfg_mod
from iclr24_jax.lm import t5
from iclr24_jax.papers import lm_inversion as li
from iclr24_jax.papers.lm_inversion import data as li_data

needs_data = pytest.mark.skipif(data_lib.shared_data_dir() is None,
                                reason="../shared/data (or $ICLR24_DATA) is absent: the prompts come from it")


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


def test_bleu_hand_worked():
  # hyp "the cat sat on the mat" vs ref "the cat sat on a mat": precisions 5/6, 3/5, 2/4, 1/3, BP 1
  # BLEU = 100 (5/6 * 3/5 * 1/2 * 1/3)^(1/4) = 100 (1/12)^(1/4) = 53.7285
  np.testing.assert_allclose(li.sentence_bleu("the cat sat on the mat", "the cat sat on a mat"),
                             100 * (1 / 12) ** 0.25, rtol=1e-9)
  assert li.sentence_bleu("the same words here", "the same words here") == pytest.approx(100.0)
  # official (sacrebleu corpus BLEU, no effective order): under 4 tokens there are no 3- or 4-grams, precision 0,
  # BLEU 0. The example "Is it" vs "Is it raining": 0.00; with effective order p1 = p2 = 1 and
  # BP = exp(1 - 3/2), so 100 e^-0.5 = 60.65.
  assert li.sentence_bleu("Is it", "Is it raining") == 0.0
  np.testing.assert_allclose(li.sentence_bleu("Is it", "Is it raining", effective_order=True),
                             100 * math.exp(-0.5), rtol=1e-12)
  # effective order, "the cat" vs "the dog": p1 = 1/2; p2 has no match -> exp smoothing 1 / (2 * 1) -> 50
  assert li.sentence_bleu("the cat", "the dog", effective_order=True) == pytest.approx(50.0)
  assert li.sentence_bleu("the cat", "the dog") == 0.0
  # 13a splits the final '?': "Is it raining?" vs "Is it raining ?" are the same 4 tokens
  assert li.sentence_bleu("Is it raining?", "Is it raining ?") == pytest.approx(100.0)
  assert li.sentence_bleu("dog", "the cat") == 0.0 and li.sentence_bleu("", "the cat") == 0.0
  with pytest.raises(ValueError, match="unknown BLEU tokenizer"):
    li.sentence_bleu("a", "a", tokenize="spacy")


@needs_data
def test_bleu_equals_sacrebleu_through_the_official_call():
  """Against sacrebleu itself, called as the official `evaluate` sacrebleu metric does (corpus_bleu of one
  sentence, defaults), on real prompts and damaged copies of them (dropped, swapped, case-changed words, cut
  short); sentence_bleu (effective order) against sacrebleu.sentence_bleu."""
  import sacrebleu
  prompts = [r["input"] for r in li_data.textdata.load_llmbar()][:80]
  prompts += [r["question"] for r in li_data.textdata.load_mario("quarel", "test")][:70]
  rng = np.random.default_rng(0)
  pairs = []
  for p in prompts:
    w = p.split()
    q = [x.upper() if rng.random() < 0.1 else x for x in w if rng.random() > 0.3]
    if len(q) > 3 and rng.random() < 0.5:
      i = rng.integers(len(q) - 1)
      q[i], q[i + 1] = q[i + 1], q[i]
    pairs.append((" ".join(q[: rng.integers(1, len(q) + 2)]), p))
  ours = [li.sentence_bleu(h, r) for h, r in pairs]
  ref = [sacrebleu.corpus_bleu([h], [[r]]).score for h, r in pairs]
  np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-9)
  assert sum(0 < b < 100 for b in ref) > 50 and sum(b == 0 for b in ref) > 3   # both regimes exercised
  eff = [li.sentence_bleu(h, r, effective_order=True) for h, r in pairs]
  np.testing.assert_allclose(eff, [sacrebleu.sentence_bleu(h, [r]).score for h, r in pairs], rtol=1e-9, atol=1e-9)


def test_token_f1_and_exact_match_hand_worked():
  # sets {a, b, c} vs {b, c, d, e}: P = 2/3, R = 1/2, F1 = 2 (1/3) / (7/6) = 4/7
  assert li.token_f1("a b c", "b c d e") == pytest.approx(4 / 7)
  # official: case-sensitive sets, {A, b} vs {a, B} share nothing; lower-cased (the variant) they are equal
  assert li.token_f1("A b b", "a B") == 0.0
  assert li.token_f1("A b b", "a B", lowercase=True) == pytest.approx(1.0)
  m = li.metrics(["a b c", "Is it?", "x"], ["b c d e", "Is it?", "y"])
  assert m["exact_match"] == pytest.approx(100 / 3)
  assert m["token_f1"] == pytest.approx(100 * (4 / 7 + 1 + 0) / 3)
  # BLEU: "Is it?" is 3 tokens under 13a, so 0 officially; the two others share no word
  assert m["bleu"] == 0.0
  with pytest.raises(ValueError, match="one per example"):
    li.metrics(["a"], ["a", "b"])


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


def test_target_samples_cached_per_prompt_and_resumed(tmp_path):
  """Sampled continuations: cached per prompt (a subset reuses them), a lost batch is regenerated identically."""
  from iclr24_jax import lm
  from iclr24_jax.lm import tokenizer as tok_lib
  tok = tok_lib.train_bpe(["is the sky blue today? can a dog fly over the sea?"] * 4, vocab_size=300)
  assert li_data.special_ids(tok) == [0, 1, 2, 3]  # train_bpe's pad, bos, eos, unk: forbidden in the samples
  cfg = lm.tiny_config(vocab_size=tok.vocab_size)
  params = lm.init_params(jax.random.key(0), cfg)
  prompts = ["is the sky blue", "can a dog fly", "the sea", "a dog", "blue sky today"]
  kw = dict(model_id="tiny", max_tokens=8, new_tokens=3, batch_size=2)
  texts = li.target_samples(params, cfg, tok, prompts, str(tmp_path), **kw)
  assert len(texts) == 5 and all(t.strip() for t in texts)
  import glob, json
  (path,) = glob.glob(str(tmp_path / "samples_*.json"))
  with open(path) as f:
    data = json.load(f)
  assert data["texts"] == dict(zip(prompts, texts))
  del data["texts"]["the sea"], data["texts"]["a dog"]  # the second batch was lost: it is regenerated the same
  with open(path, "w") as f:
    json.dump(data, f)
  assert li.target_samples(params, cfg, tok, prompts, str(tmp_path), **kw) == texts
  assert li.target_samples(None, cfg, tok, prompts[3:], str(tmp_path), **kw) == texts[3:]  # all cached: no LM


def test_baselines():
  rng = np.random.default_rng(0)
  train = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(6, 50)) * 2), -1))
  test = train[[4, 1]] + 0.01 * rng.normal(size=(2, 50))
  np.testing.assert_array_equal(li.nearest_by_kl(test, train, block=1), [4, 1])

  class Tok:
    def decode(self, ids):
      return f" w{ids[0]}"

  lp = np.log(np.array([[0.1, 0.6, 0.3]]))
  assert li.bag_of_top_tokens(lp, np.zeros(3), Tok(), k=2) == ["w1 w2"]
  # against the unigram estimate token 2 is raised most
  assert li.bag_of_top_tokens(lp, np.log(np.array([0.1, 0.9, 0.05])), Tok(), k=1) == ["w2"]


def test_derangement_is_a_permutation_without_fixed_points():
  """Every row of a shuffled control reads another row, and each row is read exactly once (the same inputs as the
  unshuffled arm, reassigned), for the sizes where a uniform permutation often has fixed points."""
  from iclr24_jax.papers.lm_inversion import data as data_lib
  for n in (2, 3, 5, 500):
    for seed in range(20):
      perm = data_lib.derangement(n, seed)
      np.testing.assert_array_equal(np.sort(perm), np.arange(n))
      assert (perm != np.arange(n)).all(), (n, seed, perm)
  np.testing.assert_array_equal(data_lib.derangement(2, 0), [1, 0])          # the only derangement of 2
  with pytest.raises(ValueError, match="at least 2"):
    data_lib.derangement(1)


def test_split_is_by_prompt_and_errors():
  prompts = [f"q{i}" for i in range(20)]
  train, test = li.split_prompts(prompts, 5)
  assert len(test) == 5 and len(train) == 15 and not set(train) & set(test)
  with pytest.raises(ValueError, match="unique"):
    li.split_prompts(["a", "a", "b"], 1)
  with pytest.raises(ValueError, match="no training prompt"):
    li.split_prompts(prompts, 20)


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


@needs_data
def test_prompts_are_deduplicated_and_capped():
  from iclr24_jax.lm import tokenizer as tok_lib
  tok = tok_lib.train_bpe(["Is the sky blue? Can a dog fly?"] * 3, vocab_size=300)
  prompts = li_data.load_prompts(tok, max_tokens=16, sources=("obqa",))
  assert len(prompts) == len(set(prompts)) > 400
  assert max(len(tok.encode(p)) for p in prompts) <= 17  # the cut text re-encodes to about its 16 tokens


@needs_data
def test_tiny_run_smoke(tmp_path):
  from iclr24_jax.configs import lm_inversion as cfg_mod
  from iclr24_jax.papers.lm_inversion import experiment
  c = cfg_mod.get_config("tiny")
  c.data.cache_dir = str(tmp_path / "cache")
  res = experiment.run(c, str(tmp_path / "run"))
  assert res["num_test"] == 32 and res["num_chunks"] == 8
  assert set(res["test"]) == {"bleu", "token_f1", "exact_match"} and np.isfinite(res["final_train_loss"])
  # the distribution cache is complete and reused: two files (train, test), each marked done for every row
  import json
  states = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("dist_*.json")]
  assert sorted(s["rows_done"] for s in states) == [32, 64] and all(s["rows_done"] == s["num_prompts"] for s in states)
  (samples,) = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("samples_*.json")]
  assert len(samples["texts"]) == 96 and samples["new_tokens"] == 4


@pytest.mark.slow
@needs_data
def test_study_fast_rows(tmp_path, monkeypatch):
  """The whole 3-seed study (lm_inversion_seeds) on the tiny config: every arm trains and the rows carry
  seed-judged verdicts."""
  from iclr24_jax.papers.lm_inversion import study
  monkeypatch.setenv("ICLR24_LM_INVERSION_CACHE", str(tmp_path / "cache"))
  rows = study.reproduce_seeds(str(tmp_path / "study"), fast=True, get_config=cfg_mod.get_config)
  # 10 seed comparisons (F1 and BLEU each): shuffled input (claims), the sample inverter's own control (checks),
  # vs samples (claims only where that control says 'yes'), bag of tokens and nearest by KL (measurements)
  compared = [r for r in rows if r.get("judgement")]
  assert len(compared) == 10 and all(r["judgement"]["n"] == 3 for r in compared)
  assert all(r["holds"] in ("yes", "no", "inconclusive") for r in compared if r["kind"] in ("claim", "check"))
  assert all(r["holds"] is None for r in compared if r["kind"] == "measurement")
  by_metric = {r["metric"]: r for r in compared}
  for key in ("token_f1", "bleu"):
    control = by_metric[f"{key}: sample inversion (T5) vs sample inversion, shuffled input"]
    vs_samples = by_metric[f"{key}: inverter vs sample inversion (T5)"]
    assert control["kind"] == "check"
    assert vs_samples["kind"] == ("claim" if control["holds"] == "yes" else "measurement")
  assert sum(r["metric"].startswith("top-") for r in rows) == 2
