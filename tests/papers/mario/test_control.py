"""MARIO control codes (`papers/mario/control.py`): quantile bins by hand, the official data-pool ties, codes and
prefixes, the masked reference."""
import collections

import chex
import jax
import numpy as np
import pytest

from iclr24_jax.lm import train as lm_train
from iclr24_jax.papers import mario
from .helpers import CFG, TEXTS, _coded_batch


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
