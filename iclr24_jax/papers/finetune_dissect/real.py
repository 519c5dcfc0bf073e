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
