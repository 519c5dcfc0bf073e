"""Motif's annotators and the cached annotation driver used by the runs.

`make_judge` builds the judge named by config.annotation.annotator ('smollm2': SmolLM2 log-probabilities read
in both orders; 'generate': SmolLM2 text + the official parser; 'oracle': the toy world's oracle; 'keywords': a
NetHack smoke-run stand-in), `load_lm` loads SmolLM2 once, `annotate` runs pairs through the resumable cache at
`cache_path`, and `label_agreement` scores labels against the toy oracle. The prompt, the parser, the judges
and the cache themselves are in `annotation.py`.
"""
from __future__ import annotations

import os
import time
from typing import Any, Sequence

import numpy as np

from iclr24_jax.papers.motif import annotation, toy


# Keyword values for NetHack messages: a stand-in judge for offline smoke runs only (not an annotator).
NETHACK_KEYWORDS = {"You kill": 2.0, "gold": 1.0, "staircase": 1.0, "descend": 2.0, "You see here": 0.5,
                    "wall": -1.0, "solid stone": -1.0, "can't": -1.0, "hurts": -1.0, "bites": -1.0}


def keyword_value(message: str) -> float:
  """Sum of NETHACK_KEYWORDS values of the keywords in a message (the 'keywords' stand-in judge)."""
  return float(sum(v for k, v in NETHACK_KEYWORDS.items() if k in message))


_LM_CACHE: dict = {}


def load_lm() -> tuple[Any, Any, Any]:
  """SmolLM2-135M-Instruct (fused params), loaded once per process."""
  if "smollm2" not in _LM_CACHE:
    from iclr24_jax import lm
    params, config, tok = lm.load_smollm2()
    _LM_CACHE["smollm2"] = (lm.fuse_params(params), config, tok)
  return _LM_CACHE["smollm2"]


def make_judge(config: Any, kind: str | None = None) -> tuple[Any, str]:
  """The annotator named by config.annotation.annotator (or `kind`) and its cache name.

  kinds: 'smollm2' (debiased log-odds), 'generate' (SmolLM2 text + official parser), 'oracle' (toy oracle),
  'keywords' (a keyword stand-in for NetHack smoke runs).

  Args:
    config: the motif ConfigDict (annotation: annotator, tau, batch_size, widths, temperature, top_p,
      max_new_tokens).
    kind: overrides config.annotation.annotator.

  Returns:
    (judge, name): the annotation judge and the name its cached annotations are stored under.

  Raises:
    ValueError: unknown kind.
  """
  a = config.annotation
  kind = kind or a.annotator
  if kind == "oracle":
    values = dict(zip(toy.CAPTIONS, toy.caption_values().tolist()))

    def value(c):
      if c not in values:
        raise ValueError(f"the oracle knows only the toy's captions, got {c!r}.")
      return values[c]

    return annotation.OracleJudge(value), "oracle"
  if kind == "keywords":
    return annotation.OracleJudge(keyword_value), "keywords"
  if kind == "smollm2":
    params, lm_config, tok = load_lm()
    judge = annotation.LogprobJudge(params, lm_config, tok, tau=float(a.tau), batch_size=int(a.batch_size),
                                    widths=tuple(a.widths), system=annotation.SYSTEM_PROMPT)
    return judge, f"smollm2-135m-q4_1/logprob/tau={float(a.tau)}/sys=motif"
  if kind == "generate":
    from iclr24_jax import lm
    params, lm_config, tok = load_lm()
    gen = lm.Generator(params, lm_config, tok, chat=False, batch_size=int(a.batch_size))

    def generate(prompts):
      return gen(list(prompts), max_new_tokens=int(a.max_new_tokens), temperature=float(a.temperature),
                 top_p=float(a.top_p), seed=0)

    name = f"smollm2-135m-q4_1/generate/t={a.temperature}/p={a.top_p}/n={a.max_new_tokens}/sys=motif"
    return annotation.GenerateJudge(generate, tok, system=annotation.SYSTEM_PROMPT), name
  raise ValueError(f"unknown annotator '{kind}'; choose 'smollm2', 'generate', 'oracle' or 'keywords'.")


def cache_path(config: Any, workdir: str, name: str) -> str:
  """Where the annotation JSONL lives: config.annotation.cache_dir (shared across runs) or the workdir.

  Args:
    config: the motif ConfigDict.
    workdir: the run folder (used when annotation.cache_dir is empty).
    name: the cache's name (judge name with '/' replaced).

  Returns:
    the path '<root>/motif_annotations_<name>.jsonl'.
  """
  root = config.annotation.get("cache_dir") or workdir
  return os.path.join(root, f"motif_annotations_{name}.jsonl")


def annotate(config: Any, pairs: Sequence[tuple[str, str]], task: str, judge: Any, judge_name: str,
             path: str | None, max_unique: int | None = None, verbose: bool = True) -> list[dict]:
  """Annotates pairs through the resumable cache. With `max_unique`, only pairs among the first `max_unique`
  distinct non-identical pairs (in data order) are kept (a CPU budget for the LLM).

  Args:
    config: the motif ConfigDict (not read).
    pairs: (caption_1, caption_2) string pairs (identical pairs are kept).
    task: the task description given to the judge.
    judge: the annotation judge (`make_judge`).
    judge_name: its cache name.
    path: the JSONL cache file, or None (memory only).
    max_unique: the budget of distinct non-identical pairs, or None.
    verbose: print progress lines.

  Returns:
    list of annotation record dicts (caption_1, caption_2, label 0 / 1 / 2 / None, ...), one per kept pair.
  """
  pairs = list(pairs)
  if max_unique is not None:
    allowed: dict[tuple[str, str], None] = {}
    for a, b in pairs:
      if a != b and (a, b) not in allowed and len(allowed) < max_unique:
        allowed[(a, b)] = None
    pairs = [p for p in pairs if p[0] == p[1] or p in allowed]
  cache = annotation.AnnotationCache(path)
  t0 = time.perf_counter()

  def progress(done, total):
    if verbose:
      print(f"  annotate [{judge_name}] {done}/{total} new pairs ({time.perf_counter() - t0:.0f} s)", flush=True)

  return annotation.annotate_pairs(pairs, task, judge, judge_name, cache, chunk_size=16, progress=progress)


def label_agreement(records: Sequence[dict]) -> dict[str, Any]:
  """Agreement of an annotator's labels with the toy oracle over distinct non-identical pairs.

  Returns:
    dict: n (distinct pairs the oracle decides), agreement (label equal to the oracle's), correct [n] (0/1),
    tie_rate (annotator ties among all distinct pairs), unparsed (labels None).
  """
  seen, correct, ties, unparsed, total = set(), [], 0, 0, 0
  for r in records:
    key = (r["caption_1"], r["caption_2"])
    if r["caption_1"] == r["caption_2"] or key in seen:
      continue
    seen.add(key)
    total += 1
    ties += r["label"] == annotation.TIE
    unparsed += r["label"] is None
    o = toy.oracle_preference(*key)
    if o != annotation.TIE:
      correct.append(float(r["label"] == o))
  return {"n": len(correct), "agreement": float(np.mean(correct)) if correct else float("nan"),
          "correct": correct, "tie_rate": ties / max(total, 1), "unparsed": unparsed, "distinct_pairs": total}
