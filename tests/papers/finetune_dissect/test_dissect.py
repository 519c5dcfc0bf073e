"""finetune_dissect (Zhang & Wu, ICLR 2024): the decomposition recovers known changes of an analytic grammar,
Eq. (1) against the LM's scoring, positions and masks, the probe set and its filter, full and LoRA finetuning, and
a smoke run of the tiny experiment."""
import dataclasses
import functools
import json
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax import lm
from iclr24_jax.configs import finetune_dissect as cfg_mod
from iclr24_jax.papers import finetune_dissect as fd
from iclr24_jax.papers.finetune_dissect import finetune as ft
from iclr24_jax.papers.finetune_dissect import grammar

SPEC = grammar.GrammarSpec(num_topics=4, topic_vocab=3, num_styles=3, style_vocab=2, num_general_subjects=5,
                           num_domain_subjects=7, num_values=4, num_sentences=4, domain_topic_prob=1.0,
                           domain_style_prob=1.0)


@functools.lru_cache(maxsize=None)
def _domain_probes(n=32, seed=0):
  @jax.jit
  def make(key):
    tables = grammar.fact_tables(jax.random.fold_in(key, 1), SPEC)
    ids = grammar.sample_documents(jax.random.fold_in(key, 2), SPEC, n, tables, "domain")
    return tables, grammar.probe_versions(jax.random.fold_in(key, 3), SPEC, ids, tables)
  tables, versions = make(jax.random.key(seed))
  return tables, {k: np.asarray(v) for k, v in versions.items()}


@pytest.mark.parametrize("which", ["topic", "style", "facts", "all"])
def test_decompose_recovers_known_grammar_changes(which):
  tables, probes = _domain_probes()
  rng = np.random.default_rng(0)
  gp0 = grammar.general_params(SPEC, tables, confidence=0.9)
  u_t = rng.normal(size=SPEC.num_topics) if which in ("topic", "all") else np.zeros(SPEC.num_topics)
  u_s = rng.normal(size=SPEC.num_styles) if which in ("style", "all") else np.zeros(SPEC.num_styles)
  a = rng.normal(size=SPEC.num_domain_subjects) if which in ("facts", "all") else np.zeros(SPEC.num_domain_subjects)
  gp1 = grammar.shift_params(gp0, SPEC, tables, u_t, u_s, a)
  deltas = {v: grammar.analytic_token_logprobs(gp1, SPEC, ids) - grammar.analytic_token_logprobs(gp0, SPEC, ids)
            for v, ids in probes.items()}
  mask = np.ones(probes["original"].shape, bool)
  mask[:, 0] = False
  out = fd.decompose(deltas, mask, reduction="sum")
  # Ground truth from the changes alone (softmax normalisers cancel in every contrast):
  ps, pt, pj = (SPEC.positions(k) for k in range(3))
  t_other = (probes["topic"][:, pt[0]] - SPEC.topic_start) // SPEC.topic_vocab
  s_other = (probes["style"][:, ps[0]] - SPEC.style_start) // SPEC.style_vocab
  dsub = probes["original"][:, pj] - SPEC.subject_start - SPEC.num_general_subjects
  truth = {"topic": np.mean(u_t[SPEC.domain_topic] - u_t[t_other]),
           "style": np.mean(u_s[SPEC.domain_style] - u_s[s_other]),
           "factual": np.mean(a[dsub].sum(-1))}   # log-odds shift of true vs counterfactual, summed over facts
  for k, v in truth.items():
    np.testing.assert_allclose(out[k], v, atol=1e-5)
  # By position: topic only at the first topic word, style at the first style word, facts at the value tokens.
  bp = out["by_position"]
  np.testing.assert_allclose(np.delete(bp["topic"][1:], pt[0] - 1), 0.0, atol=1e-12)
  np.testing.assert_allclose(np.delete(bp["style"][1:], ps[0] - 1), 0.0, atol=1e-12)
  np.testing.assert_allclose(np.delete(bp["factual"][1:], SPEC.positions(3) - 1), 0.0, atol=1e-12)
  for k in truth:
    np.testing.assert_allclose(np.nansum(bp[k]), truth[k], atol=1e-5)
  # Per-token unit = per-document / number of counted tokens (all documents have seq_len - 1).
  per_tok = fd.decompose(deltas, mask, reduction="mean")
  for k in truth:
    np.testing.assert_allclose(per_tok[k], truth[k] / (SPEC.seq_len - 1), atol=1e-6)


def test_analytic_logprobs_normalised():
  # The grammar is a distribution: enumerate every document of a 1-sentence grammar and sum p(x) = 1.
  spec = grammar.GrammarSpec(num_topics=2, topic_vocab=2, num_styles=2, style_vocab=2, num_general_subjects=1,
                             num_domain_subjects=2, num_values=2, num_sentences=1)
  tables = grammar.fact_tables(jax.random.key(0), spec)
  gp = grammar.general_params(spec, tables, confidence=0.7)
  docs = []
  for sw in range(spec.num_styles * spec.style_vocab):
    for tw in range(spec.num_topics * spec.topic_vocab):
      for sj in range(spec.num_subjects):
        for v in range(spec.num_values):
          docs.append([grammar.BOS, spec.style_start + sw, spec.topic_start + tw, spec.subject_start + sj,
                       spec.value_start + v, grammar.SEP])
  lp = grammar.analytic_token_logprobs(gp, spec, np.array(docs)).sum(-1)
  np.testing.assert_allclose(np.exp(lp).sum(), 1.0, rtol=1e-10)


def test_probe_versions_change_one_factor():
  tables, probes = _domain_probes()
  o = probes["original"]
  ps, pt, pj, pv = (SPEC.positions(k) for k in range(4))
  assert np.all((o[:, pt] - SPEC.topic_start) // SPEC.topic_vocab == SPEC.domain_topic)
  assert np.all((o[:, ps] - SPEC.style_start) // SPEC.style_vocab == SPEC.domain_style)
  for name, pos in (("topic", pt), ("style", ps), ("counterfactual", pv)):
    diff = probes[name] != o
    assert np.all(diff[:, pos]) and not np.any(np.delete(diff, pos, axis=1)), name
  # The training domain mix is mostly (domain_topic_prob = 0.8), not only, on the domain topic.
  mix = dataclasses.replace(SPEC, domain_topic_prob=0.8)
  tables = grammar.fact_tables(jax.random.key(5), mix)
  docs = np.asarray(jax.jit(lambda k: grammar.sample_documents(k, mix, 4000, tables, "domain"))(jax.random.key(6)))
  frac = np.mean((docs[:, pt[0]] - SPEC.topic_start) // SPEC.topic_vocab == SPEC.domain_topic)
  assert abs(frac - 0.8) < 0.02   # 4000 draws: SE 0.0063
  t = (probes["topic"][:, pt] - SPEC.topic_start) // SPEC.topic_vocab
  assert np.all(t == t[:, :1]) and np.all(t != SPEC.domain_topic)
  assert np.all(probes["topic"][:, pt] % SPEC.topic_vocab == o[:, pt] % SPEC.topic_vocab)  # same word index


def test_token_logprob_change_matches_scoring_and_masks():
  cfg = lm.tiny_config(vocab_size=50)
  init = jax.jit(lm.init_params, static_argnums=1)
  p0, p1 = init(jax.random.key(0), cfg), init(jax.random.key(1), cfg)
  ids = jax.random.randint(jax.random.key(2), (3, 7), 0, 50)
  mask = jnp.array([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4], bool)
  f = jax.jit(fd.token_logprob_change, static_argnums=2)
  d = f(p0, p1, cfg, ids, mask)
  chex.assert_shape(d, (3, 7))
  score = jax.jit(lm.token_logprobs, static_argnums=1)
  ref = score(p1, cfg, ids, mask) - score(p0, cfg, ids, mask)
  np.testing.assert_allclose(d, ref, atol=1e-6)
  assert np.all(np.asarray(d)[~np.asarray(mask)] == 0.0) and np.all(np.asarray(d)[:, 0] == 0.0)
  np.testing.assert_allclose(f(p0, p0, cfg, ids, mask), 0.0, atol=0.0)
  with pytest.raises(ValueError, match="batch, time"):
    fd.token_logprob_change(p0, p1, cfg, ids[0], None)
  with pytest.raises(ValueError, match="mask shape"):
    fd.token_logprob_change(p0, p1, cfg, ids, mask[:, :3])
  with pytest.raises(ValueError, match="integer"):
    fd.token_logprob_change(p0, p1, cfg, ids.astype(jnp.float32), None)


def test_decompose_by_hand_with_rejected_rows():
  # Two documents, 3 positions. Per-token means: original [2, 4]; topic [1, 1]; style [0, NaN (rejected)];
  # cf [2, 3]. topic = mean(1, 3) = 2; style = mean(2) = 2 (row 1 dropped); factual = mean(0, 1) = 0.5.
  deltas = {"original": np.array([[1., 2., 3.], [4., 4., 4.]]), "topic": np.array([[1., 1., 1.], [1., 1., 1.]]),
            "style": np.array([[0., 0., 0.], [9., 9., 9.]]), "counterfactual": np.array([[2., 2., 2.], [3., 3., 3.]])}
  masks = {k: np.ones((2, 3), bool) for k in deltas}
  masks["style"] = np.array([[1, 1, 1], [0, 0, 0]], bool)
  out = fd.decompose(deltas, masks)
  assert out["topic"] == pytest.approx(2.0) and out["style"] == pytest.approx(2.0)
  assert out["factual"] == pytest.approx(0.5) and out["total"] == pytest.approx(3.0)
  assert out["num_documents"]["style"] == 1 and out["num_documents"]["topic"] == 2
  # By position: original [2.5, 3, 3.5]; style rows: only row 0 -> [0, 0, 0].
  np.testing.assert_allclose(out["by_position"]["style"], [2.5, 3.0, 3.5])
  np.testing.assert_allclose(out["by_position"]["factual"], [0.0, 0.5, 1.0])
  # Versions of different lengths are padded (masked) to one T.
  short = dict(deltas, topic=np.array([[1.], [1.]]))
  out2 = fd.decompose(short, None)
  assert out2["by_position"]["topic"].shape == (3,) and np.isnan(out2["by_position"]["versions"]["topic"][1])
  with pytest.raises(ValueError, match="missing"):
    fd.decompose({"original": deltas["original"]})
  with pytest.raises(ValueError, match="NaN"):
    fd.decompose(dict(deltas, topic=np.array([[np.nan] * 3, [1.] * 3])))
  with pytest.raises(ValueError, match="one row per source document"):
    fd.decompose(dict(deltas, topic=np.ones((3, 3))))


def test_half_time_and_early_share_by_hand():
  # values 0 -> (10: 1) -> (20: 3) -> (30: 4): half of 4 = 2 reached between 10 and 20, at 10 + 10 * (1/2) = 15.
  assert fd.half_time(np.array([10, 20, 30]), np.array([1.0, 3.0, 4.0])) == pytest.approx(15.0)
  assert math.isnan(fd.half_time(np.array([10, 20]), np.array([0.0, -1.0])))
  # |c| = [3, 1, 0, 0, 0, 0, 0, 4] -> first quarter (2 positions) = 4 / 8.
  assert fd.early_share(np.array([3., -1., 0., 0., 0., 0., 0., 4.])) == pytest.approx(0.5)


def test_make_probe_set_and_filter():
  docs = ["Is the sky blue? yes, because of scattering.", "Do fish swim? yes, they have fins."]
  seen = []

  def rewriter(prompts):
    seen.extend(prompts)
    tag = lambda p: "CASUAL" if "casual" in p else ("TOPIC" if "different subject" in p else "CF")
    return [f"Sure! Here is the text: \"{tag(p)} {p.splitlines()[-1].upper()}\"" for p in prompts]

  probes = fd.make_probe_set(docs, rewriter)
  assert set(probes) == {"original", "topic", "style", "counterfactual"}
  assert probes["style"][0] == "CASUAL " + docs[0].upper() and len(seen) == 6   # preamble and quotes stripped
  # Embeddings by hand: original e0; style row 0 cos 0.8 (kept), row 1 cos 0.5 (rejected); topic cos 0 (kept).
  e = {docs[0]: [1, 0, 0], docs[1]: [0, 1, 0]}
  rows = {("style", 0): [0.8, 0.6, 0], ("style", 1): [0, 0.5, math.sqrt(0.75)], ("topic", 0): [0, 0, 1],
          ("topic", 1): [0, 0, 1], ("counterfactual", 0): [0.7, 0, math.sqrt(0.51)],
          ("counterfactual", 1): [0, 0.99, math.sqrt(1 - 0.99 ** 2)]}
  table = {probes[v][i]: vec for (v, i), vec in rows.items()}
  table.update(e)
  kept, report = fd.filter_probes(probes, lambda ts: np.array([table[t] for t in ts], float))
  assert kept["style"][0] is not None and kept["style"][1] is None
  assert kept["topic"] == probes["topic"]
  assert kept["counterfactual"][0] is not None and kept["counterfactual"][1] is None   # 0.99 > 0.95: a copy
  assert report["style"]["accepted"] == 1 and report["style"]["rate"] == 0.5
  with pytest.raises(ValueError, match="empty"):
    fd.make_probe_set(["ok", " "], rewriter)
  with pytest.raises(ValueError, match="answers"):
    fd.make_probe_set(docs, lambda ps: ps[:1])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  from iclr24_jax.papers.finetune_dissect import experiment
  workdir = str(tmp_path_factory.mktemp("finetune_dissect_tiny"))
  return workdir, experiment.run(cfg_mod.get_config("tiny"), workdir)


def test_full_and_lora_finetuning_learn(tiny_run):
  # The tiny run pretrains 2 seeds, then finetunes fully and with rank-2 LoRA adapters (one program each).
  _, res = tiny_run
  assert set(res["methods"]) == {"full", "lora2"}
  for m, r in res["methods"].items():
    # Finetuning on the domain raises the likelihood of fixed domain texts (the probes' originals; per token, every
    # seed): the loss on a fixed batch goes down.
    assert np.all(np.array(r["total"])[:, -1] > 0.0), m
  # Full finetuning also lowers the training loss (mean of the last 10 steps vs the first 10); rank-2 LoRA at this
  # learning rate moves it by less than the minibatch noise in 20 steps (its fixed-batch change above is positive).
  full = res["methods"]["full"]
  assert np.all(np.array(full["final_loss"]) < np.array(full["first_loss"]))
  with pytest.raises(ValueError, match="lora<rank>"):
    ft.method_lora("qlora", cfg_mod.get_config("tiny").lora)


def test_finetune_checks_and_lora_init_is_base():
  cfg = cfg_mod.get_config("tiny")
  spec = ft.spec_from_config(cfg.data)
  mcfg = ft.model_config(spec, cfg.model)
  with pytest.raises(ValueError, match="multiple"):
    ft.make_finetune(spec, mcfg, None, steps=15, eval_every=10, batch_size=8, learning_rate=1e-3)
  # LoRA starts at the base model (B = 0): Eq. (1) is exactly 0 there.
  lora = ft.lora_config(2)

  @jax.jit
  def base_and_merged(key):
    params = lm.init_params(key, mcfg)
    state = ft.lm_train.init_train_state(params, ft.make_optimizer(1e-3, 10), lora_config=lora,
                                         key=jax.random.fold_in(key, 1))
    return params, ft.lm_train.model_params(state, lora)
  params, merged = base_and_merged(jax.random.key(0))
  ids = jnp.asarray(_domain_probes()[1]["original"]) % mcfg.vocab_size
  d = jax.jit(fd.token_logprob_change, static_argnums=2)(params, merged, mcfg, ids)
  np.testing.assert_allclose(d, 0.0, atol=1e-6)


def test_experiment_tiny(tiny_run):
  workdir, res = tiny_run
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert len(saved["methods"]["full"]["topic"]) == 2 and len(saved["methods"]["full"]["topic"][0]) == 2
  assert all(os.path.exists(p) for p in res["plots"])
  assert os.path.exists(os.path.join(workdir, "metrics.jsonl"))
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("huge")


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


def test_general_entropy_by_hand_and_by_sampling():
  # Default grammar (4 topics x 8 words, 3 styles x 4, 64 + 512 subjects, 16 values, 4 sentences), nats per document:
  # ln 12 + 3 ln 4 + ln 32 + 3 ln 8 + 4 (ln 576 + 512/576 ln 16)
  # = 2.48491 + 4.15888 + 3.46574 + 6.23832 + 4 (6.35611 + 2.46452) = 51.63037; / 20 scored tokens = 2.58152.
  spec = ft.spec_from_config(cfg_mod.get_config("").data)
  ent = grammar.general_entropy(spec)
  assert ent["per_token"] == pytest.approx(51.63037 / 20, abs=1e-5)
  assert ent["later_topic"] == pytest.approx(math.log(8)) and ent["first_topic"] == pytest.approx(math.log(32))
  # Independently: the exact log-probabilities of sampled documents (only the value slot varies between documents:
  # 0 nats for a general subject, ln 16 for a domain one), averaged over 4000 documents: per-token SE
  # = ln 16 * sqrt(0.889 * 0.111) * sqrt(4 values) / 20 tokens / sqrt(4000) = 1.4e-3 -> 5 SE = 0.007.
  tables = grammar.fact_tables(jax.random.key(0), spec)
  ids = np.asarray(jax.jit(lambda k: grammar.sample_documents(k, spec, 4000, tables, "general"))(jax.random.key(1)))
  lp = grammar.analytic_token_logprobs(grammar.general_params(spec, tables), spec, ids)
  assert -lp[:, 1:].mean() == pytest.approx(ent["per_token"], abs=0.007)
  np.testing.assert_allclose(-lp[:, spec.positions(1)[1:]], math.log(8), rtol=1e-12)
  with pytest.raises(ValueError, match="num_sentences >= 2"):
    grammar.general_entropy(dataclasses.replace(spec, num_sentences=1))


SMALL = ft.spec_from_config(cfg_mod.get_config("tiny").data)   # 3 topics x 4 words, 2 styles x 3 words, 3 sentences


def _assert_base_models_grammar(fit, ent, tol=0.05):
  fit = {k: np.asarray(v) for k, v in fit.items()}
  # Within tol of the entropy per token, and later topic / style words near ln V_t / ln V_s: a base that ignores
  # the context would pay ln(T V_t) / ln(S V_s) there.
  for k in ("per_token", "later_topic", "later_style"):
    assert np.all(np.abs(fit[k] - ent[k]) < tol), (k, fit[k], ent[k])


def test_tiny_pretraining_learns_to_read_the_context(tiny_run):
  # The tiny config's base (1 layer, 4 heads, 600 steps on 6-sentence documents; 2 seeds) on fresh 3-sentence
  # documents. Without the context a later topic word costs ln(3 * 4) = 2.485 nats instead of ln 4 = 1.386, a style
  # word ln(2 * 3) = 1.792 instead of ln 3 = 1.099.
  _, res = tiny_run
  ent = grammar.general_entropy(SMALL)
  assert res["entropy"]["per_token"] == pytest.approx(ent["per_token"])
  assert ent["later_topic"] == pytest.approx(math.log(4)) and ent["first_topic"] == pytest.approx(math.log(12))
  assert len(res["base_fit"]["per_token"]) == 2
  _assert_base_models_grammar(res["base_fit"], ent)


def test_base_fit_row_checks_every_seed():
  from iclr24_jax.papers.finetune_dissect import study
  ent = grammar.general_entropy(SMALL)
  good = {k: np.full(3, ent[k] + 0.01) for k in ("per_token", *ft.FIT_SLOTS)}
  row = study.base_fit_row({"base_fit": good, "entropy": ent, "spec": SMALL}, "x")
  assert row["kind"] == "check" and row["holds"] == "yes"
  # One seed that ignores the context: its later topic words cost ln(T V_t) = ln 12.
  bad = dict(good, later_topic=np.array([ent["later_topic"], ent["later_topic"], math.log(12)]))
  assert study.base_fit_row({"base_fit": bad, "entropy": ent, "spec": SMALL}, "x")["holds"] == "no"


@pytest.mark.slow
def test_default_pretraining_models_the_grammar():
  # The study's pretraining (configs/finetune_dissect.py, 3 seeds vmapped; ~2 CPU-minutes): every base within 0.05
  # nats/token of the grammar's entropy, its later topic words within 0.05 of ln 8 and style words of ln 4.
  cfg = cfg_mod.get_config("")
  spec = ft.spec_from_config(cfg.data)
  pre_spec = ft.pretrain_spec(spec, cfg.pretrain)
  mcfg = ft.model_config(spec, cfg.model, max_seq_len=max(64, pre_spec.seq_len))
  pre = ft.make_pretrain(pre_spec, mcfg, steps=cfg.pretrain.steps, batch_size=cfg.pretrain.batch_size,
                         learning_rate=cfg.pretrain.learning_rate, init_scale=cfg.pretrain.init_scale)

  @jax.jit
  def run(keys):
    def one(key):
      params, tables, _ = pre(key)
      return ft.base_fit(params, mcfg, spec, tables, jax.random.fold_in(key, 7), 512)
    return jax.vmap(one)(keys)
  _assert_base_models_grammar(run(jax.random.split(jax.random.key(cfg.seed), cfg.num_seeds)),
                              grammar.general_entropy(spec))


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
  from iclr24_jax.papers.finetune_dissect import real
  rows = real.rows_from_run(_fake_real_run())
  for r in rows:
    stats.row_kind(r)
  cmp = [r for r in rows if r["metric"].startswith("style vs factual")]
  assert len(cmp) == 2 and not any(r["metric"].startswith("topic vs") for r in rows)   # no topic pairs
  held, in_set = (next(r for r in cmp if real.ARM_LABEL[a] in r["experiment"]) for a in ("held_out", "in_set"))
  assert held["kind"] == "claim" and in_set["kind"] == "measurement" and in_set["holds"] is None
  # Signed means over the 5 documents with both versions: style (0.4 - 0.4 + 0.4 - 0.4 + 0.1) / 5 = 0.02, factual
  # 0.2: diff -0.18 (the mean of absolute contrasts, 0.34, would have put style above factual).
  j = held["judgement"]
  assert j["n"] == 5 and j["mean_a"] == pytest.approx(0.02) and j["diff"] == pytest.approx(-0.18)
  assert held["holds"] != "yes"
  # the style version gets + eps, so its contrast gets - eps: seed means 0.02 + 0.01, 0.02, 0.02 - 0.01
  assert held["judgement_seeds"]["a"] == pytest.approx([0.03, 0.02, 0.01])
  # Factual share: total 1.0 and factual 0.2 on every kept document: total / 2 - factual = 0.3 with no spread.
  share = next(r for r in rows if r["metric"].startswith("factual share") and real.ARM_LABEL["held_out"]
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


def test_prior_shift_row_against_the_closed_form():
  from iclr24_jax.papers.finetune_dissect import study
  spec = ft.spec_from_config(cfg_mod.get_config("").data)   # p = 0.8, 4 topics, 3 styles
  # Closed form: topic ln(0.8 * 3 / 0.2) = ln 12 = 2.4849; style ln(0.8 * 2 / 0.2) = ln 8 = 2.0794.
  bp = {k: np.zeros((3, spec.seq_len)) for k in ("topic", "style", "factual")}
  bp["topic"][:, 2] = math.log(12) + np.array([0.05, -0.05, 0.0])    # slot order: BOS, style, topic, ...
  bp["style"][:, 1] = math.log(8)
  fake = {"spec": spec, "methods": {"full": {"by_position": bp}}}
  row = study.prior_shift_row(fake, "x")
  assert row["kind"] == "check" and row["holds"] == "yes" and "max |error| 0.050" in row["notes"]
  bp["style"][1, 1] = math.log(8) - 0.2     # one seed short of the closed form by 0.2 nats
  assert study.prior_shift_row(fake, "x")["holds"] == "no"
