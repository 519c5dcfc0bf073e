"""Finetune-dissect real text (`papers/finetune_dissect/real.py`): encoding, rows and contrasts, chunked scoring, the
pipeline end to end (slow)."""
import chex
import jax
import numpy as np
import pytest

from iclr24_jax import lm
from iclr24_jax.papers import finetune_dissect as fd


def test_real_text_encoding_marks_rejected_rows():
  from iclr24_jax.papers.finetune_dissect import real
  tok = lm.train_bpe(["the cat sat on the mat"] * 4, vocab_size=300)
  ids, mask = real.encode_right(tok, ["the cat sat", None, "the mat " * 20], max_len=8)
  chex.assert_shape(ids, (3, 8))
  assert ids[0, 0] == tok.bos_id and mask[0, 0] and not mask[1].any() and mask[2].all()   # truncated to 8
  assert mask[0].sum() == 1 + len(tok.encode("the cat sat"))


@pytest.mark.slow
def test_real_text_pipeline_runs(tmp_path):
  # SmolLM2 rewrites (cached), MiniLM filter, 2 LoRA steps, decomposition: runs end to end (minutes on CPU).
  pytest.importorskip("gguf")
  from iclr24_jax.papers.finetune_dissect import real
  try:
    lm.find_smollm2_gguf()
  except Exception as e:   # noqa: BLE001
    pytest.skip(f"SmolLM2 not installed: {e}")
  res = real.run_real_text(str(tmp_path), dict(num_probe_documents=2, num_train_documents=4, steps=2,
                                               batch_size=2, max_len=48, max_new_tokens=16, seeds=(0, 1)))
  assert set(res["report"]) == {"topic", "style", "counterfactual"}
  assert np.isfinite(res["parts"]["total"])
  assert len(res["parts_by_seed"]) == 2 and len(res["losses"]) == 2
  # the seeds differ (LoRA init, document order), and the seed-averaged total is the mean of the seeds' totals
  assert res["losses"][0] != res["losses"][1]
  np.testing.assert_allclose(res["parts"]["total"], np.mean([p["total"] for p in res["parts_by_seed"]]), rtol=1e-5)


def _fake_real_run():
  # Per-document contrasts (T = 2: token 1 is the only scored one, so a document's per-token change is its value):
  # original 1.0 everywhere; style contrast c_s = [0.4, -0.4, 0.4, -0.4, 0.1, 0.1]; factual 0.2 everywhere, the
  # last document's counterfactual rejected by the filter; topic rejected everywhere. Seeds add +-0.01 to the
  # style version (seed mean = the seed-averaged value).
  c_s = np.array([0.4, -0.4, 0.4, -0.4, 0.1, 0.1])
  mk = lambda v: np.stack([np.zeros(6), v], axis=1)
  masks = {v: np.ones((6, 2), bool) for v in fd.VERSIONS}
  for m in masks.values():
    m[:, 0] = False
  masks["counterfactual"][5] = False
  masks["topic"][:] = False
  by_seed = []
  for eps in (-0.01, 0.0, 0.01):
    d = {"original": mk(np.ones(6)), "topic": mk(np.ones(6)), "style": mk(1.0 - c_s + eps),
         "counterfactual": mk(np.full(6, 0.8))}
    by_seed.append(fd.decompose(d, masks))
  parts = fd.decompose({"original": mk(np.ones(6)), "topic": mk(np.ones(6)), "style": mk(1.0 - c_s),
                        "counterfactual": mk(np.full(6, 0.8))}, masks)
  arm = dict(parts=parts, parts_by_seed=by_seed, documents=6,
             report={v: {"accepted": 6, "total": 6} for v in ("topic", "style", "counterfactual")})
  rep = {v: {"accepted": 12, "total": 12, "rate": 1.0, "mean_cosine": 0.5} for v in ("topic", "style",
                                                                                     "counterfactual")}
  return dict(arms={"held_out": arm, "in_set": arm}, report=rep, losses=[[2.0, 1.5, 1.4, 1.3]] * 3,
              settings=dict(lora_rank=8, steps=4, num_train_documents=8), cache_path="/tmp/cache.jsonl")


def test_real_text_rows_signed_contrasts_and_arms():
  from iclr24_jax.common import stats
  from iclr24_jax.papers.finetune_dissect import study
  rows = study.rows_from_run(_fake_real_run())
  for r in rows:
    stats.row_kind(r)
  cmp = [r for r in rows if r["metric"].startswith("style vs factual")]
  assert len(cmp) == 2 and not any(r["metric"].startswith("topic vs") for r in rows)   # no topic pairs
  held, in_set = (next(r for r in cmp if study.ARM_LABEL[a] in r["experiment"]) for a in ("held_out", "in_set"))
  assert held["kind"] == "claim" and in_set["kind"] == "measurement" and in_set["holds"] is None
  # Signed means over the 5 documents with both versions: style (0.4 - 0.4 + 0.4 - 0.4 + 0.1) / 5 = 0.02, factual
  # 0.2: diff -0.18 (the mean of absolute contrasts, 0.34, would have put style above factual).
  j = held["judgement"]
  assert j["n"] == 5 and j["mean_a"] == pytest.approx(0.02) and j["diff"] == pytest.approx(-0.18)
  assert held["holds"] != "yes"
  # the style version gets + eps, so its contrast gets - eps: seed means 0.02 + 0.01, 0.02, 0.02 - 0.01
  assert held["judgement_seeds"]["a"] == pytest.approx([0.03, 0.02, 0.01])
  # Factual share: total 1.0 and factual 0.2 on every kept document: total / 2 - factual = 0.3 with no spread.
  share = next(r for r in rows if r["metric"].startswith("factual share") and study.ARM_LABEL["held_out"]
               in r["experiment"])
  assert share["kind"] == "claim" and share["holds"] == "yes" and share["judgement"]["diff"] == pytest.approx(0.3)
  assert "factual / total = 0.20" in share["notes"]


def test_score_chunks_equals_one_call():
  from iclr24_jax.papers.finetune_dissect import real
  cfg = lm.tiny_config(vocab_size=40)
  params = jax.jit(lm.init_params, static_argnums=1)(jax.random.key(0), cfg)
  ids = np.asarray(jax.random.randint(jax.random.key(1), (5, 6), 0, 40), np.int32)
  mask = np.ones((5, 6), bool)
  mask[1] = False                       # a rejected probe
  mask[3, 4:] = False                   # right padding
  score = jax.jit(lm.token_logprobs, static_argnums=1)
  np.testing.assert_allclose(real._score_chunks(score, params, cfg, ids, mask, chunk=2),
                             score(params, cfg, ids, mask), atol=1e-6)
