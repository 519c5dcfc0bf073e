"""Real text: MaRio StrategyQA questions and rationales as the domain, SmolLM2-135M-Instruct rewrites as probes.

  documents (question + rationale) -> make_probe_set (SmolLM2 rewrites, cached) -> filter_probes (MiniLM)
  -> LoRA finetuning of SmolLM2 on the domain documents -> Eq. (1) on every version -> decompose, per probe arm

Two probe arms share the rewriter, the filter and the finetuned models: the held-out arm probes StrategyQA
documents that are not in the finetuning set (what a finetuned model has learned about the domain, the claims'
arm), the in-set arm probes documents it was finetuned on (their memorised wording enters every contrast, so its
comparisons are measurements). The abstract's comparisons are judged on signed mean contrasts by a paired bootstrap
over documents of the seed-averaged per-document contrasts (the documents, not the finetuning seeds, are the main
source of noise); the per-seed judgement is in each row's notes.

Deviations (all forced by what runs offline on 2 CPU cores): the base model is SmolLM2-135M-Instruct (the only
SmolLM2 here; the paper finetunes Llama-2-7B and other base models), it also writes the rewrites (the paper uses
ChatGPT), the domain is a few dozen StrategyQA documents (the paper: 1,000 PubMed abstracts up to 1,024 tokens),
finetuning is LoRA rank 8 for a few steps at a larger learning rate (official: 3e-6 for one epoch). The
rewrites and the filter are shared; the finetuning runs once per seed (LoRA init and document order).
"""
from __future__ import annotations

import os
import time

import jax
import numpy as np

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import stats
from iclr24_jax.papers.finetune_dissect import dissect
from iclr24_jax.papers.finetune_dissect import finetune
from iclr24_jax.papers.finetune_dissect import probes as probes_lib

PAPER = "finetune_dissect"
# num_probe_documents: the in-set arm (the first finetuning documents); num_heldout_documents: the held-out arm (the
# StrategyQA documents after the finetuning set); score_batch: rows per scoring call (bounds the [B, T, 49152]
# logits).
DEFAULTS = dict(num_probe_documents=36, num_heldout_documents=36, num_train_documents=48, steps=12, batch_size=4,
                max_len=96, learning_rate=3e-4, lora_rank=8, max_new_tokens=80, seeds=(0, 1, 2), score_batch=12)
ARMS = ("held_out", "in_set")
REAL = ("'finetuning results in significant shifts in the language model's topic and style priors, while actual "
        "knowledge learning only contributes to a small fraction of the total probability change' (abstract)")


def domain_documents(n: int, data_dir: str | None = None) -> list[dict]:
  """The first n StrategyQA training questions with a real rationale, one per distinct question.

  Args:
    n: number of documents.
    data_dir: the shared data folder; None resolves it (`common.data.shared_data_dir`, env ICLR24_DATA).

  Returns:
    list of {'text': question + ' ' + rationale, 'answer'} (fewer than n if the split runs out).

  Raises:
    FileNotFoundError: the MaRio data is missing (the message names the path and the fix).
  """
  from iclr24_jax.common.textdata import load_mario
  seen, out = set(), []
  for r in load_mario("strategyqa", "train", data_dir):
    if not r["has_rationale"] or r["question"] in seen:
      continue
    seen.add(r["question"])
    out.append({"text": f"{r['question'].strip()} {r['rationale'].strip()}", "answer": r["answer"]})
    if len(out) == n:
      break
  return out


def _cache(workdir: str):
  from iclr24_jax import lm
  from iclr24_jax.lm import weights
  root = weights.cache_dir()
  path = os.path.join(str(root) if root is not None else workdir, "finetune_dissect_rewrites.jsonl")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return lm.GenerationCache(path), path


def encode_right(tok, texts: list[str | None], max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded ids / masks (None -> an all-False row: a rejected probe); BOS prepended so the first word is
  scored.

  Args:
    tok: a tokenizer with `bos_id` and `encode(text) -> list[int]`.
    texts: N texts; None marks a rejected probe.
    max_len: T; longer texts are cut after T tokens (BOS included).

  Returns:
    (ids [N, T] int32, mask [N, T] bool).
  """
  rows = []
  for t in texts:
    rows.append([] if t is None else ([tok.bos_id] + tok.encode(t))[:max_len])
  ids = np.zeros((len(rows), max_len), np.int32)
  mask = np.zeros((len(rows), max_len), bool)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
    mask[i, :len(r)] = True
  return ids, mask


def _score_chunks(score, params, config, ids: np.ndarray, mask: np.ndarray, chunk: int) -> np.ndarray:
  """log p(x_t | x_<t) of every row, `chunk` rows per call (one compiled shape: the last chunk is padded with
  all-False rows), so the [chunk, T, vocab] logits stay small.

  Args:
    score: jitted `lm.token_logprobs` (params, config static, ids, mask).
    params, config: the LM.
    ids, mask: [N, T] from `encode_right`.
    chunk: rows per call.

  Returns:
    [N, T] float32 (0 at padding, at BOS and in all-False rows).
  """
  n = ids.shape[0]
  pad = (-n) % chunk
  ids_p = np.concatenate([ids, np.zeros((pad, ids.shape[1]), ids.dtype)])
  mask_p = np.concatenate([mask, np.zeros((pad, mask.shape[1]), bool)])
  out = [np.asarray(score(params, config, ids_p[i:i + chunk], mask_p[i:i + chunk])) for i in range(0, n + pad, chunk)]
  return np.concatenate(out)[:n]


def run_real_text(workdir: str, settings: dict | None = None) -> dict:
  """The whole real-text pipeline (module docstring). Returns the decomposition of each probe arm, the filter
  report and timings.

  Args:
    workdir: folder for the rewrite cache when no LM cache folder is set.
    settings: overrides of `DEFAULTS`: num_train_documents (finetuned on), num_probe_documents (the in-set arm:
      the first of the finetuning documents), num_heldout_documents (the held-out arm: the documents after the
      finetuning set, never finetuned on), steps, batch_size, max_len, learning_rate, lora_rank, max_new_tokens,
      seeds (the finetuning seeds), score_batch (rows per scoring call).

  Returns:
    dict(arms {arm in `ARMS`: dict(parts (`dissect.decompose` of the seed-averaged changes, per_document [N]
    arrays included), parts_by_seed [S] (the same per seed), report {version: accepted, total}, documents N)},
    report (filter acceptance over both arms, with mean cosines), losses [S, steps], seconds, rewrite_seconds,
    train_seconds, score_seconds, cache_path, cached_before, settings, examples {version: first kept text}).

  Raises:
    ValueError: more in-set probes than finetuning documents, or too few StrategyQA documents for both arms.
  """
  from iclr24_jax import lm
  from iclr24_jax.lm import train as lm_train
  s = dict(DEFAULTS, **(settings or {}))
  n_train, n_in, n_out = (int(s[k]) for k in ("num_train_documents", "num_probe_documents",
                                               "num_heldout_documents"))
  if not 0 < n_in <= n_train or n_out < 1:
    raise ValueError(f"need 0 < num_probe_documents ({n_in}) <= num_train_documents ({n_train}) (the in-set "
                     f"probes are finetuning documents) and num_heldout_documents >= 1 (got {n_out}).")
  t0 = time.time()
  docs = domain_documents(n_train + n_out)
  if len(docs) < n_train + n_out:
    raise ValueError(f"StrategyQA has {len(docs)} distinct documents with a rationale; {n_train} finetuning + "
                     f"{n_out} held-out were asked for.")
  arm_docs = {"in_set": docs[:n_in], "held_out": docs[n_train:n_train + n_out]}
  rows = {"in_set": np.arange(n_in), "held_out": n_in + np.arange(n_out)}   # rows of the probe arrays
  probe_docs = arm_docs["in_set"] + arm_docs["held_out"]
  params, config, tok = lm.load_smollm2()
  judge = lm.SmolLMJudge(params, config, tok, batch_size=8)
  cache, cache_path = _cache(workdir)
  n_cached = len(cache)
  rewriter = probes_lib.cached_rewriter(judge, cache, max_new_tokens=int(s["max_new_tokens"]), chunk_size=8)
  probe_set = probes_lib.make_probe_set([d["text"] for d in probe_docs], rewriter)
  t_rewrite = time.time() - t0
  mparams, mconfig, mtok = lm.load_minilm()
  kept, report = probes_lib.filter_probes(probe_set, lambda ts: lm.embed_sentences(mparams, mconfig, mtok, ts),
                                          answers=[d["answer"] for d in probe_docs])
  # LoRA finetuning on the domain documents (the in-set probes among them, the held-out ones not).
  lora = finetune.lora_config(int(s["lora_rank"]))
  steps, bs = int(s["steps"]), int(s["batch_size"])
  tx = finetune.make_optimizer(float(s["learning_rate"]), steps)
  train_ids, train_mask = encode_right(tok, [d["text"] for d in docs[:n_train]], int(s["max_len"]))
  init = jax.jit(lambda p, k: lm_train.init_train_state(p, tx, lora_config=lora, key=k))
  # All steps in one compiled lax.scan (`common.loop.scan_steps`) over the stacked batches [steps, B, T].
  train = jax.jit(loop_lib.scan_steps(lm_train.make_train_step(config, lora)), donate_argnums=0)
  merged = jax.jit(lambda st: lm_train.model_params(st, lora))
  score = jax.jit(lm.token_logprobs, static_argnums=1)
  encoded = {v: encode_right(tok, kept[v], int(s["max_len"])) for v in dissect.VERSIONS}
  masks = {}
  for v, (_, mask) in encoded.items():
    masks[v] = mask.copy()
    masks[v][:, 0] = False   # BOS: no prediction
  chunk = int(s["score_batch"])
  t1 = time.time()
  # Eq. (1) = log p_ft - log p_base (`dissect.token_logprob_change`); the base half is the same for every seed,
  # so it is scored once.
  base_lp = {v: _score_chunks(score, params, config, ids, mask, chunk) for v, (ids, mask) in encoded.items()}
  t_score = time.time() - t1
  seeds = [int(x) for x in s["seeds"]]
  losses, deltas_by_seed, t_train = [], [], 0.0
  for seed in seeds:
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(n_train) for _ in range(steps * bs // n_train + 1)])
    idx = order[:steps * bs].reshape(steps, bs)
    t1 = time.time()
    state = init(params, jax.random.key(seed))
    state, m = train(state, {"ids": train_ids[idx], "mask": train_mask[idx]}, jax.random.key(seed))
    losses.append([float(x) for x in jax.device_get(m["loss"])])
    t_train += time.time() - t1
    t1 = time.time()
    ft_params = merged(state)
    deltas_by_seed.append({v: _score_chunks(score, ft_params, config, ids, mask, chunk) - base_lp[v]
                           for v, (ids, mask) in encoded.items()})
    t_score += time.time() - t1
  arms = {}
  for arm in ARMS:
    r = rows[arm]
    arm_masks = {v: m[r] for v, m in masks.items()}
    arms[arm] = dict(
        parts=dissect.decompose({v: np.mean([d[v][r] for d in deltas_by_seed], axis=0) for v in encoded},
                                arm_masks),
        parts_by_seed=[dissect.decompose({v: d[v][r] for v in encoded}, arm_masks) for d in deltas_by_seed],
        report={v: {"accepted": int(sum(kept[v][i] is not None for i in r)), "total": int(r.size)}
                for v in report},
        documents=int(r.size))
  return dict(arms=arms, report=report, losses=losses, seconds=time.time() - t0, rewrite_seconds=t_rewrite,
              train_seconds=t_train, score_seconds=t_score, cache_path=cache_path, cached_before=n_cached,
              settings=s, examples={v: next((t for t in kept[v] if t is not None), None) for v in kept})


def _paired_bootstrap_row(*, experiment: str, metric: str, a: np.ndarray, b: np.ndarray, a_by_seed, b_by_seed,
                          name_a: str, name_b: str, paper_value: str, kind: str, basis: str, notes: str) -> dict:
  """A row for "mean a > mean b" over documents, judged by the paired bootstrap over documents
  (`stats.bootstrap_diff`) of the seed-averaged per-document values; the per-seed judgement (`stats.judge`,
  paired by seed) goes in the notes and under `judgement_seeds`.

  Args:
    experiment, metric, paper_value, basis, notes: the row's labels (notes are prefixed with the per-seed numbers).
    a, b: [N] seed-averaged per-document values of each arm (the same documents).
    a_by_seed, b_by_seed: [S] per-seed means over the same documents.
    name_a, name_b: arm names.
    kind: 'claim' (judged) or 'measurement' (holds None; the numbers stay in `judgement`).

  Returns:
    A reproduction row dict.
  """
  boot = stats.bootstrap_diff(a, b, paired=True, direction="greater")
  seeds = stats.judge(a_by_seed, b_by_seed, paired=True, direction="greater")
  ours = (f"{name_a} {boot['mean_a']:+.4f} vs {name_b} {boot['mean_b']:+.4f}; diff {boot['diff']:+.4f} "
          f"[{boot['lo']:+.4f}, {boot['hi']:+.4f}] (95% paired bootstrap over {boot['n']} documents, "
          f"seed-averaged)")
  seed_note = (f"per seed ({seeds['n']} finetuning seeds, paired): diff {seeds['diff']:+.4f} +- "
               f"{seeds['se_diff']:.4f} ({seeds['holds']}; the seeds share the documents, so their SE leaves out "
               f"the documents' sampling error)")
  return dict(paper=PAPER, experiment=experiment, metric=metric, ours=ours, paper_value=paper_value,
              holds=None if kind == "measurement" else boot["holds"], kind=kind, basis=basis,
              notes=f"{notes}; {seed_note}" if notes else seed_note,
              judgement=dict(boot, direction="greater", unit="documents"),
              judgement_seeds=dict(seeds, a=[float(x) for x in a_by_seed], b=[float(x) for x in b_by_seed]))


ARM_LABEL = {"held_out": "held-out probes (documents not finetuned on)",
             "in_set": "in-set probes (documents of the finetuning set)"}
IN_SET_NOTE = ("not a claim: these probed texts were finetuned on, so Delta(original) holds their memorised wording "
               "and every rewrite's contrast grows with how far it departs from that wording, whatever factor it "
               "changes; the held-out arm carries the claim")


def real_text_rows(workdir: str, settings: dict | None = None) -> list[dict]:
  """`rows_from_run(run_real_text(workdir, settings))`.

  Args:
    workdir: as in `run_real_text`.
    settings: as in `run_real_text`.

  Returns:
    list of reproduction row dicts (see `rows_from_run`).
  """
  return rows_from_run(run_real_text(workdir, settings))


def rows_from_run(res: dict) -> list[dict]:
  """Rows of a real-text run: acceptance rates and components (measurements) of both probe arms, and the
  abstract's comparisons on signed mean contrasts (style vs factual, topic vs factual where >= 3 documents have
  both, factual vs half the total): claims on the held-out probes, measurements on the in-set ones.

  Args:
    res: `run_real_text` output (arms {arm: parts, parts_by_seed, report, documents}, report, losses, settings,
      cache_path).

  Returns:
    list of reproduction row dicts (paper, experiment, metric, ours, paper_value, holds, kind, basis, notes).
  """
  rep, s = res["report"], res["settings"]
  n_seeds = len(res["losses"])
  exp = (f"real text: StrategyQA, SmolLM2-135M-Instruct LoRA r{s['lora_rank']} {s['steps']} steps on "
         f"{s['num_train_documents']} documents, {n_seeds} finetuning seeds")
  acc = "; ".join(f"{v} {r['accepted']}/{r['total']} (mean cos {r['mean_cosine']:.2f})" for v, r in rep.items())
  per_arm = "; ".join(f"{arm}: " + ", ".join(f"{v} {r['accepted']}/{r['total']}" for v, r in a["report"].items())
                      for arm, a in res["arms"].items())
  first = np.mean([ls[0] for ls in res["losses"]])
  last = np.mean([np.mean(ls[-3:]) for ls in res["losses"]])
  rows = [dict(paper=PAPER, experiment=exp, metric="rewrites kept by the MiniLM filter", ours=acc,
               paper_value="(ChatGPT rewrites, not filtered)", holds=None, kind="measurement",
               notes=f"{per_arm}; thresholds fixed in probes.FILTER_RULES before any rewrite was read; rewrites "
                     f"cached in {os.path.basename(res['cache_path'])}; finetuning loss {first:.3f} -> {last:.3f} "
                     f"(seed mean)")]
  for arm in ARMS:
    a = res["arms"][arm]
    parts, by_seed = a["parts"], a["parts_by_seed"]
    pd = parts["per_document"]
    arm_exp = f"{exp}; {ARM_LABEL[arm]}"
    for k in ("topic", "style", "factual", "total"):
      ok = np.isfinite(pd[k])
      v = pd[k][ok]
      per_seed = [float(np.mean(p["per_document"][k][ok])) for p in by_seed] if ok.any() else []
      m, se = stats.mean_se(per_seed) if v.size else (float("nan"), float("nan"))
      lo, hi = stats.bootstrap_ci(v) if v.size > 1 else (float("nan"), float("nan"))
      rows.append(dict(paper=PAPER, experiment=arm_exp, metric=f"{k} component, signed mean (nats/token)",
                       ours=(f"{m:+.4f} +- {se:.4f} over {n_seeds} seeds ({v.size} of {a['documents']} documents)"
                             if v.size else f"no data (0 of {a['documents']} documents)"),
                       paper_value="topic and style dominate the change; factual is a small part", holds=None,
                       kind="measurement",
                       notes=(f"95% bootstrap interval over documents of the seed-averaged change: [{lo:+.4f}, "
                              f"{hi:+.4f}]" if v.size > 1 else "")))
    kind = "claim" if arm == "held_out" else "measurement"
    for k in ("topic", "style"):
      both = np.isfinite(pd[k]) & np.isfinite(pd["factual"])
      if both.sum() < 3:
        continue
      rows.append(_paired_bootstrap_row(
          experiment=arm_exp, metric=f"{k} vs factual, signed mean over {int(both.sum())} documents (nats/token)",
          a=pd[k][both], b=pd["factual"][both],
          a_by_seed=[float(np.mean(p["per_document"][k][both])) for p in by_seed],
          b_by_seed=[float(np.mean(p["per_document"]["factual"][both])) for p in by_seed],
          name_a=k, name_b="factual", paper_value=f"{k} shift exceeds factual knowledge's", kind=kind, basis=REAL,
          notes=("documents where both rewrites passed the filter; signed contrasts (a mean of absolute "
                 "per-document contrasts would reward the noisier rewrite)"
                 + ("" if arm == "held_out" else f"; {IN_SET_NOTE}"))))
    ok = np.isfinite(pd["factual"])
    if ok.sum() >= 3:
      fac, tot = pd["factual"][ok], pd["total"][ok]
      lo, hi = _ratio_ci(fac, tot)
      rows.append(_paired_bootstrap_row(
          experiment=arm_exp, metric=(f"factual share of the total change: total / 2 vs factual, {int(ok.sum())} "
                                      "documents (nats/token)"),
          a=0.5 * tot, b=fac, a_by_seed=[0.5 * float(np.mean(p["per_document"]["total"][ok])) for p in by_seed],
          b_by_seed=[float(np.mean(p["per_document"]["factual"][ok])) for p in by_seed],
          name_a="total/2", name_b="factual", paper_value="factual knowledge is a small fraction of the total change",
          kind=kind, basis=REAL,
          notes=(f"factual / total = {np.mean(fac) / np.mean(tot):.2f} [{lo:.2f}, {hi:.2f}] (ratio of means, 95% "
                 "bootstrap over documents); judged as factual < total / 2, the weakest reading of 'a small "
                 "fraction'; documents with a kept counterfactual"
                 + ("" if arm == "held_out" else f"; {IN_SET_NOTE}"))))
  return rows


def _ratio_ci(num: np.ndarray, den: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
  """95% percentile bootstrap interval over documents of mean(num) / mean(den) (paired resampling)."""
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, num.size, size=(n_boot, num.size))
  with np.errstate(divide="ignore", invalid="ignore"):
    r = num[idx].mean(1) / den[idx].mean(1)
  lo, hi = np.nanquantile(r, [0.025, 0.975])
  return float(lo), float(hi)
