"""MaRio (Ramnath et al., ICLR 2024): rewards on hand-worked strings, quantile bins, control codes after the
decoder start / assistant header, the Quark loss (KL = 0 when policy = reference, the masked reference equals the
code-free one), a train step that learns, sampling, and a smoke run of the tiny experiment."""
import collections
import json
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.configs import mario as cfg_mod
from iclr24_jax.lm import llama, lora, scoring, t5
from iclr24_jax.lm import tokenizer as tok_lib
from iclr24_jax.lm import train as lm_train
from iclr24_jax.papers import mario

CFG = llama.tiny_config(vocab_size=320, max_seq_len=256)
TEXTS = ["Can a cat swim? Cats can swim but most do not like water. So the answer is yes.",
         "Is the sun a planet? The sun is a star, not a planet. So the answer is no.",
         "Do fish breathe air? Most fish breathe water through gills. So the answer is no."] * 20


@pytest.fixture(scope="module")
def tok():
  t = tok_lib.train_bpe(TEXTS + ["<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"], vocab_size=300,
                        special_tokens=tok_lib.TRAIN_SPECIALS + ("<|im_start|>", "<|im_end|>"))
  import dataclasses
  return dataclasses.replace(t, eos_id=t.backend.token_to_id("<|im_end|>"))


@pytest.fixture(scope="module")
def params():
  return llama.init_params(jax.random.key(0), CFG)


# ------------------------------------------------------------------------------------------------- rewards


def test_diversity_hand_worked():
  # no repeated n-gram -> (1 - 0)^3 = 1
  assert mario.diversity_reward("the cat sat on the mat") == 1.0
  # "a b a b a b": 2-grams ab ba ab ba ab (2 unique / 5) -> rep2 0.6; 3-grams aba bab aba bab (2/4) -> 0.5;
  # 4-grams abab baba abab (2/3) -> 1/3; diversity = 0.4 * 0.5 * (2/3) = 0.133333
  np.testing.assert_allclose(mario.diversity_reward("a b a b a b"), 0.4 * 0.5 * (2 / 3), rtol=1e-12)
  assert mario.repetition_rates("a b a b a b") == pytest.approx({2: 0.6, 3: 0.5, 4: 1 / 3})
  # "x x x": 2-grams (x x) twice -> rep2 1/2; one 3-gram -> 0; no 4-gram -> counting stops, rep4 = 0
  assert mario.diversity_reward("x x x") == 0.5
  # the answer part is cut: "a b a b" -> 2-grams ab ba ab (2/3) -> rep2 1/3, 3-grams aba bab -> 0, one 4-gram
  np.testing.assert_allclose(mario.diversity_reward("a b a b So the answer is yes."), 2 / 3, rtol=1e-12)
  assert mario.diversity_reward("") == 1.0 and mario.diversity_reward("word") == 1.0
  with pytest.raises(TypeError):
    mario.diversity_reward(["a list"])


def test_split_response_and_accuracy():
  assert mario.split_response("Cats swim. So the answer is Yes.") == ("Cats swim.", "yes")
  assert mario.split_response("no marker here") == ("no marker here", "")
  assert mario.format_response("Cats swim", "yes") == "Cats swim. So the answer is yes."
  acc = mario.accuracy_reward(["R. So the answer is yes.", "R. So the answer is (B).", "R. the answer: yes"],
                              ["yes", "(A)", "yes"])
  np.testing.assert_array_equal(acc, [1.0, 0.0, 0.0])
  with pytest.raises(ValueError, match="gold"):
    mario.accuracy_reward(["a"], [])


def test_consistency_equals_score_continuations(params, tok):
  """P(gold | q, r) - P(gold | q), softmax over the length-normalised choice log-likelihoods, recomputed from
  lm.score_continuations (prompt + " choice")."""
  qs = ["Can a cat swim?", "Is the sun a planet?", "Do fish breathe air?"]
  rs = ["Cats can swim.", "The sun is a star.", "Fish use gills."]
  golds = ["yes", "no", "no"]
  choices = ("yes", "no")
  got = mario.consistency_reward(params, CFG, tok, qs, rs, golds, choices, batch_size=4)

  def probs(prompts):
    cols = []
    for c in choices:
      s = scoring.score_continuations(params, CFG, tok, prompts, [" " + c] * len(prompts))
      cols.append(s["mean_logprob"])
    lp = np.stack(cols, 1)
    p = np.exp(lp - lp.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)

  from iclr24_jax.papers.mario import rewards
  with_r = probs([rewards.answer_prompt(q, r) for q, r in zip(qs, rs)])
  without = probs([rewards.answer_prompt(q) for q in qs])
  gi = np.array([0, 1, 1])
  np.testing.assert_allclose(got, with_r[np.arange(3), gi] - without[np.arange(3), gi], atol=1e-5)
  assert np.all(np.abs(got) <= 1.0)
  with pytest.raises(ValueError, match="choices"):
    mario.consistency_reward(params, CFG, tok, qs[:1], rs[:1], ["maybe"], choices)
  # The memo of question-only probabilities: same numbers, filled once, reused (a repeated question included).
  memo = {}
  first = mario.consistency_reward(params, CFG, tok, qs + qs[:1], rs + rs[1:2], golds + golds[:1], choices,
                                   batch_size=4, memo=memo)
  assert len(memo) == 3
  np.testing.assert_allclose(first[:3], got, atol=1e-6)
  memo[(rewards.answer_prompt(qs[0]), choices)] = np.asarray([1.0, 0.0])   # a planted value must be read back
  again = mario.consistency_reward(params, CFG, tok, qs[:1], rs[:1], golds[:1], choices, batch_size=4, memo=memo)
  np.testing.assert_allclose(again, with_r[0, 0] - 1.0, atol=1e-5)


def test_plausibility_is_debiased_log_odds(params, tok):
  qs, rs = ["Can a cat swim?", "Is the sun a planet?"], ["Cats can swim.", "The sun is a star."]
  got = mario.plausibility_reward(params, CFG, tok, qs, rs, batch_size=4)
  ab, ba = zip(*[mario.plausibility_prompts(r) for r in rs])
  lp_ab = scoring.choice_logprobs(params, CFG, tok, list(ab), ["(a)", "(b)"])
  lp_ba = scoring.choice_logprobs(params, CFG, tok, list(ba), ["(a)", "(b)"])
  # "Yes" is (a) in order ab and (b) in order ba: log-odds for Yes = ((a - b)_ab + (b - a)_ba) / 2
  pref = 0.5 * ((lp_ab[:, 0] - lp_ab[:, 1]) + (lp_ba[:, 1] - lp_ba[:, 0]))
  np.testing.assert_allclose(got, 1 / (1 + np.exp(-pref)), atol=1e-5)
  assert "(a) Yes\n(b) No" in ab[0] and "(a) No\n(b) Yes" in ba[0]
  # the judge sees the rationale alone (official VERA 'plausibility'); the question only on request
  # ('plausibility-w-qn'), and then the score changes with it
  assert all(q not in p for q in qs for p in ab + ba) and "Cats can swim." in ab[0]
  with_q = mario.plausibility_prompts(rs[0], question=qs[0])
  assert with_q[0].index(qs[0]) < with_q[0].index(rs[0])
  got_q = mario.plausibility_reward(params, CFG, tok, qs, rs, batch_size=4, with_question=True)
  assert np.abs(got_q - got).max() > 0                       # a random model: tiny, but the question is read
  with pytest.raises(TypeError):
    mario.plausibility_prompts(qs[0], rs[0])                  # the question is keyword-only: no silent swap


# ------------------------------------------------------------------------------------------ bins and codes


def test_quantile_bins_hand_worked():
  # 5 distinct rewards, 5 bins: rank (best first) = bin
  np.testing.assert_array_equal(mario.quantile_bins([0.9, 0.1, 0.5, 0.3, 0.7]), [0, 4, 2, 3, 1])
  # 12 distinct: bins of 12 // 5 = 2, the remainder (2) in the last bin (official data_pool_n.py)
  r = np.arange(12, 0, -1).astype(float)                 # already best-first
  np.testing.assert_array_equal(mario.quantile_bins(r), [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4])
  # official ties: a stable best-first sort keeps equal rewards in pool order, so they fill bins 0, 1, 2
  np.testing.assert_array_equal(mario.quantile_bins([1.0, 1.0, 1.0, 0.5, 0.0]), [0, 1, 2, 3, 4])
  np.testing.assert_array_equal(mario.quantile_bins([0.5, 1.0, 0.0, 1.0], num_bins=2), [1, 0, 1, 0])
  # the alternative rule: a tie group shares the bin of its best position
  np.testing.assert_array_equal(mario.quantile_bins([1.0, 1.0, 1.0, 0.5, 0.0], ties="shared"), [0, 0, 0, 3, 4])
  # fewer samples than bins: official N // 5 = 0 puts everything in the last bin; 'shared' spreads them
  np.testing.assert_array_equal(mario.quantile_bins([0.2, 0.8]), [4, 4])
  np.testing.assert_array_equal(mario.quantile_bins([0.2, 0.8], ties="shared"), [2, 0])
  assert mario.quantile_bins([]).shape == (0,)
  with pytest.raises(ValueError, match="NaN"):
    mario.quantile_bins([0.1, np.nan])
  with pytest.raises(ValueError, match="1-D"):
    mario.quantile_bins(np.zeros((2, 2)))
  with pytest.raises(ValueError, match="ties"):
    mario.quantile_bins([0.1], ties="random")


def _official_pool_add(pool, prompts, responses, scores, rewards, num_bins):
  """Python reference of the official DataPool_N.add (mario/data_pool_n.py, 'quark' option, no filtering): per
  reward a stable reverse sort of the whole pool, bins by position (N // num_bins each, the rest in the last bin),
  accuracy coded by correctness (here 0 = correct), codes stored per (prompt, response), and the pool rebuilt in
  the last reward's sorted order."""
  pool["prompt"] += prompts
  pool["response"] += responses
  for k in rewards:
    pool["score"].setdefault(k, []).extend(scores[k])
  codes = collections.defaultdict(dict)
  for k in rewards:
    data = list(zip(pool["prompt"], pool["response"], pool["score"][k]))
    sorted_data = sorted(data, key=lambda x: x[2], reverse=True)
    if k == "accuracy":
      cat = [0 if x[2] > 0.5 else 1 for x in sorted_data]
    else:
      cat = [i for i in range(num_bins) for _ in range(len(sorted_data) // num_bins)]
      cat = cat + [num_bins - 1] * (len(sorted_data) - len(cat))
    for j, x in enumerate(sorted_data):
      codes[(x[0], x[1])][k] = cat[j]
      codes[(x[0], x[1])][k + "_score"] = x[2]
  pool["prompt"] = [x[0] for x in sorted_data]
  pool["response"] = [x[1] for x in sorted_data]
  pool["score"] = {k: [codes[(x[0], x[1])][k + "_score"] for x in sorted_data] for k in rewards}
  return [(x[0], x[1], {k: codes[(x[0], x[1])][k] for k in rewards}) for x in sorted_data]


def test_data_pool_ties_follow_the_official_rule(tok):
  # 65.9% of StrategyQA's silver rationales have diversity exactly 1.0: the official rule still fills all 5 bins
  r = np.where(np.arange(600) < 395, 1.0, np.linspace(0.9, 0.5, 600))
  np.testing.assert_array_equal(np.bincount(mario.quantile_bins(r)), [120] * 5)
  np.testing.assert_array_equal(np.bincount(mario.quantile_bins(r, ties="shared"), minlength=5), [395, 0, 0, 85, 120])
  # Two rounds with ties, a duplicated (question, response), and 2 + 1 rewards: same order and codes as the
  # official pool.
  codes = mario.ControlCodes.from_tokenizer(tok, rewards=("plausibility", "diversity"), num_bins=3)
  rng = np.random.default_rng(0)
  pool, ref = mario.DataPool(codes), {"prompt": [], "response": [], "score": {}}
  for rnd, n in enumerate((7, 9)):
    qs = [f"q{rnd}_{i % 4}" for i in range(n)]
    rs = [f"r{rnd}_{i % 5}" for i in range(n)]
    qs[-1], rs[-1] = qs[0], rs[0]                           # a duplicate row, scored alike
    sc = {"plausibility": rng.choice([0.2, 0.5, 0.5, 0.9], n), "diversity": rng.choice([1.0, 1.0, 0.7], n),
          "accuracy": rng.choice([0.0, 1.0], n)}
    for k in sc:
      sc[k][-1] = sc[k][0]
    pool.add(qs, rs, sc)
    want = _official_pool_add(ref, qs, rs, {k: list(v) for k, v in sc.items()}, codes.names, 3)
    assert list(zip(pool.questions, pool.responses)) == [(p, q) for p, q, _ in want]
    bins = pool.bins()
    for name in codes.names:
      np.testing.assert_array_equal(bins[name], [b[name] for _, _, b in want], err_msg=f"round {rnd} {name}")
    assert pool.prefixes()[0] == mario.control_prefix(want[0][2], codes)


def test_quantile_bins_monotone_and_balanced():
  rng = np.random.default_rng(0)
  r = rng.normal(size=1000)
  b = mario.quantile_bins(r, num_bins=5)
  order = np.argsort(-r)
  assert np.all(np.diff(b[order]) >= 0)                  # a better reward never gets a worse bin
  np.testing.assert_array_equal(np.bincount(b), [200] * 5)


def test_control_codes_and_prefix(tok):
  codes = mario.ControlCodes.from_tokenizer(tok)
  assert len(codes.ids) == 3 * 5 + 2 and len(set(codes.ids)) == 17 and codes.num_codes == 4
  for i in codes.ids:                                    # single-token control characters, never in the text
    assert all(i not in tok.encode(t, add_bos=False) for t in TEXTS[:3])
  pre = mario.control_prefix({"plausibility": 0, "diversity": 4, "consistency": 2, "accuracy": 1}, codes)
  assert pre == [codes.ids[0], codes.ids[5 + 4], codes.ids[10 + 2], codes.ids[16]]
  assert mario.control_prefix(codes.best(), codes) == [codes.ids[0], codes.ids[5], codes.ids[10], codes.ids[15]]
  with pytest.raises(ValueError, match="missing"):
    mario.control_prefix({"plausibility": 0}, codes)
  with pytest.raises(ValueError, match="outside"):
    codes.token("diversity", 5)


def test_data_pool_rebins_everything(tok):
  codes = mario.ControlCodes.from_tokenizer(tok, rewards=("diversity",), num_bins=2)
  pool = mario.DataPool(codes)
  pool.add(["q1", "q2"], ["r1", "r2"], {"diversity": [0.9, 0.1], "accuracy": [1.0, 0.0]})
  assert pool.prefixes() == [[codes.ids[0], codes.ids[2]], [codes.ids[1], codes.ids[3]]]
  pool.add(["q3", "q4"], ["r3", "r4"], {"diversity": [1.0, 0.95], "accuracy": [0.0, 1.0]})
  # whole pool re-binned: 1.0, 0.95 best half; 0.9, 0.1 worst half; stored in the accuracy sort's order
  # (correct first, stable): q1, q4 (correct), then q2, q3
  assert pool.questions == ["q1", "q4", "q2", "q3"]
  np.testing.assert_array_equal(pool.bins()["diversity"], [1, 0, 1, 0])
  np.testing.assert_array_equal(pool.bins()["accuracy"], [0, 0, 1, 1])
  with pytest.raises(ValueError):
    pool.add(["q"], ["r", "s"], {"diversity": [0.1], "accuracy": [1.0]})


# ------------------------------------------------------------------------------------------ policy and loss


def _coded_batch(tok, with_codes=True):
  codes = mario.ControlCodes.from_tokenizer(tok)
  qs = ["Can a cat swim?", "Is the sun a planet?", "Do fish breathe air?", "Can a cat swim?"]
  rs = ["Cats can swim. So the answer is yes.", "The sun is a star. So the answer is no.",
        "Gills. So the answer is no.", "Most cats dislike water. So the answer is no."]
  pre = [mario.control_prefix(codes.best(), codes), mario.control_prefix(codes.worst(), codes)] * 2
  return codes, qs, rs, mario.encode_examples(tok, qs, rs, pre if with_codes else None, max_len=64)


def test_codes_follow_the_assistant_header(tok):
  codes, qs, rs, batch = _coded_batch(tok)
  header = tok.encode(mario.prompt_text(qs[0]), add_bos=False)
  k = codes.num_codes
  np.testing.assert_array_equal(batch["ids"][0, :len(header)], header)
  np.testing.assert_array_equal(batch["ids"][0, len(header):len(header) + k], mario.control_prefix(codes.best(), codes))
  assert batch["code_mask"][0].sum() == k and batch["code_mask"][0, len(header):len(header) + k].all()
  assert not (batch["loss_mask"] & batch["code_mask"]).any()  # codes are conditioned on, never learned
  n_resp = len(tok.encode(" " + rs[0], add_bos=False)) + 1   # response + <|im_end|>
  assert batch["loss_mask"][0].sum() == n_resp


def test_masked_reference_equals_code_free_reference(params, tok):
  """The reference reads the coded row with the codes masked out: its logits at the response tokens equal those
  of the row without codes (positions count real tokens only)."""
  _, _, _, coded = _coded_batch(tok, True)
  _, _, _, plain = _coded_batch(tok, False)
  ref_in = {"ids": coded["ids"], "mask": coded["mask"] & ~coded["code_mask"], "loss_mask": coded["loss_mask"]}
  f = jax.jit(lambda p, b: lm_train.causal_target_logits(p, CFG, b))
  lc, _, wc = f(params, ref_in)
  lp, _, wp = f(params, {k: plain[k] for k in ("ids", "mask", "loss_mask")})
  for i in range(4):
    a = np.asarray(lc[i])[np.asarray(wc[i]) > 0]
    b = np.asarray(lp[i])[np.asarray(wp[i]) > 0]
    chex.assert_equal_shape((a, b))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


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
  out = jax.jit(lambda q, i, msk, c, k: mario.sample(q, cfg, i, msk, c, k, max_new_tokens=4, temperature=0.0))(
      p, base["inputs"], base["input_mask"], codes, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out.tokens[:, :2]), codes)  # the codes right after the start token


def test_llama_sample_continues_after_codes(params, tok):
  codes = mario.ControlCodes.from_tokenizer(tok)
  ids, mask = mario.encode_prompts(tok, ["Can a cat swim?", "Is the sun a planet?"], 32)
  c = np.asarray([mario.control_prefix(codes.best(), codes)] * 2, np.int32)
  out = jax.jit(lambda p, i, m, cc, k: mario.sample(p, CFG, i, m, cc, k, max_new_tokens=3, temperature=0.0))(
      params, ids, mask, c, jax.random.key(0))
  full = np.concatenate([ids, c], 1)
  fmask = np.concatenate([mask, np.ones_like(c, bool)], 1)
  first = np.argmax(np.asarray(llama.forward(params, CFG, full, fmask, last_only=True)), -1)
  np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), first)  # greedy token after prompt + codes
  with pytest.raises(ValueError, match="codes must be"):
    mario.sample(params, CFG, ids, mask, c[:1], jax.random.key(0), max_new_tokens=2)


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


# ---------------------------------------------------------------------------------------------- experiment


def test_tiny_experiment_smoke(tmp_path):
  from iclr24_jax.configs import mario as cfg_mod
  from iclr24_jax.papers.mario import experiment
  cfg = cfg_mod.get_config("tiny")
  cfg.sft_matched = "pool"                                  # the budget-matched SFT arm trains beside MaRio
  res = experiment.run(cfg, str(tmp_path))
  for arm in ("sft", "mario", "mario_worst", "sft_matched"):
    for n in ("plausibility", "diversity", "consistency", "accuracy"):
      assert np.isfinite(res[arm][n])
  assert res["pool_size"] >= cfg.samples_per_round  # at least the silver rationales
  with open(os.path.join(tmp_path, "results.json")) as f:
    assert json.load(f)["num_eval"] == cfg.data.num_eval
  rows = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
  assert {r["stage"] for r in rows} == {"sft", "quark0", "sft_matched0"}
  # the matched arm takes as many steps as the Quark round: its logged steps mirror quark0's
  assert [r["step"] for r in rows if r["stage"] == "sft_matched0"] == [r["step"] for r in rows
                                                                      if r["stage"] == "quark0"]
  cfg.sft_matched = "later"
  with pytest.raises(ValueError, match="sft_matched"):
    experiment.run(cfg, str(tmp_path / "bad"))


def test_valid_accuracy_and_majority_baseline():
  from iclr24_jax.papers.mario import study
  # 5 responses, 4 valid; correct among the valid: 1, 0, 1, 1 -> 3 / 4 = 0.75 (the invalid one cannot be right)
  acc, ok = [1.0, 0.0, 1.0, 0.0, 1.0], [True, True, True, False, True]
  assert study._valid_accuracy(acc, ok) == (0.75, 4)
  items = [{"answer": a} for a in ("no", "yes", "no", "No", "yes")]     # 'no' 3 of 5 (case-insensitive)
  assert study._majority_baseline(items) == ("no", 0.6)
  note = study._accuracy_note({"SFT": (acc, ok)}, items)
  assert "SFT 0.750 on 4/5 valid" in note and "always 'no'): 0.600" in note


@pytest.mark.slow
def test_study_rows_on_the_tiny_model(tmp_path):
  from iclr24_jax.papers.mario import study
  rows = study.reproduce(str(tmp_path), fast=True, variant="strategyqa,tiny", get_config=cfg_mod.get_config)
  assert len(rows) == 12 and rows[0]["plots"] and os.path.exists(rows[0]["plots"][0])
  for r in rows[:8]:   # one seed: measurements, the bootstrap's word in the notes, never 'no' without a reference
    assert r["holds"] is None and "mario_seeds" in r["notes"] and "'no'" not in r["notes"]
  assert all(r["holds"] is None for r in rows[8:])
  for r in rows[:8]:   # beside every accuracy row: accuracy on valid responses and the majority baseline
    assert ("majority baseline" in r["notes"]) == r["metric"].startswith("accuracy")


@pytest.mark.slow
def test_seeded_study_on_the_tiny_model(tmp_path):
  """reproduce_seeds: 3 training seeds on one test subset, every comparison judged on per-seed means."""
  from iclr24_jax.papers.mario import study
  rows = study.reproduce_seeds(str(tmp_path), fast=True, get_config=cfg_mod.get_config)
  # (a) 4 + (b) 4 + budget-matched SFT (the seeds variant's sft_matched='pool') 4 + the reference row 4
  assert len(rows) == 16 and os.path.exists(rows[0]["plots"][0])
  for r in rows[:12]:
    assert r["holds"] in ("yes", "inconclusive") and len(r["judgement"]["a"]) == 3
    assert "3 seeds, paired" in r["ours"] and "pooled over seeds" in r["notes"]
    assert ("majority baseline" in r["notes"]) == r["metric"].startswith("accuracy")
  assert sum("budget-matched" in r["experiment"] for r in rows) == 4
  assert all(r["holds"] is None for r in rows[12:])
  with open(os.path.join(tmp_path, "mario_seeds_details.json")) as f:
    details = json.load(f)
  assert [d["seed"] for d in details["seeds"]] == [0, 1, 2]
