"""Controlled-variable probe texts from real documents: rewrites by an instruction-following LM, filtered by
sentence-embedding similarity.

The paper asks ChatGPT for versions of each PubMed abstract that change one factor (its topic moved out of the
biomedical domain, its style made casual or rap, its facts made counterfactual). Offline, the only instruction
model is SmolLM2-135M-Instruct (no base SmolLM2 exists here), so the rewriter is that model with the prompts below,
its outputs cached (`lm.GenerationCache`), and a MiniLM (all-MiniLM-L6-v2) filter rejects failed rewrites.

  probes = make_probe_set(documents, rewriter)                  # {'original': docs, 'topic': [...], ...}
  kept, report = filter_probes(probes, embed_fn, answers=...)   # None where a rewrite was rejected
"""
from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

import numpy as np

# Deviation: the paper's prompts to ChatGPT are not public in the official repository; these say the same thing
# in the plain words a 135M instruction model follows best (one sentence of instruction, the text after it).
REWRITE_PROMPTS: dict[str, str] = {
    "topic": ("Write a short paragraph of the same length about a completely different subject (for example "
              "cooking, football or music), in the same plain explanatory style:\n\n{text}"),
    "style": "Rewrite this text in a casual, chatty style, like a friend talking. Keep all the facts:\n\n{text}",
    "counterfactual": ("Rewrite this text in the same style but change its facts so that they are false "
                       "(change names, numbers and claims):\n\n{text}"),
}

# Filter thresholds, fixed before any rewrite was read (not tuned to the result): a style rewrite must keep the
# meaning (cosine >= 0.6 to the original), a counterfactual stay on the subject but differ in content
# (0.4 <= cosine <= 0.95), a topic rewrite leave the subject (cosine <= 0.3). Every rewrite must be non-empty
# and differ from the original.
FILTER_RULES: dict[str, tuple[float, float]] = {"style": (0.6, 1.0), "counterfactual": (0.4, 0.95),
                                                "topic": (-1.0, 0.3)}

_PREAMBLE = re.compile(r"^(sure|here|certainly|okay|ok)\b[^\n:]*:\s*", re.IGNORECASE)


def clean_rewrite(text: str) -> str:
  """Strips an assistant preamble ('Sure! Here is the rewritten text:'), quotes and surrounding space."""
  t = text.strip()
  t = _PREAMBLE.sub("", t, count=1).strip()
  if len(t) >= 2 and t[0] == t[-1] and t[0] in "\"'":
    t = t[1:-1].strip()
  return t


def make_probe_set(documents: Sequence[str], rewriter: Callable[[list[str]], Sequence[str]],
                   prompts: Mapping[str, str] | None = None) -> dict[str, list[str]]:
  """Controlled-variable versions of each document, written by an instruction-following LM.

  Args:
    documents: N original texts (the finetuning domain's kind of text).
    rewriter: list of instruction prompts -> one answer per prompt (e.g. a `cached_rewriter(SmolLMJudge())`).
    prompts: {version name: template with '{text}'} (default `REWRITE_PROMPTS`: topic, style, counterfactual).

  Returns:
    {'original': the N documents, version: N rewrites (cleaned with `clean_rewrite`)}; row i of every version
    comes from document i.
  """
  if isinstance(documents, str):
    raise TypeError("make_probe_set takes a list of documents, got one str; wrap it in a list.")
  documents = [str(d) for d in documents]
  if not documents:
    raise ValueError("make_probe_set needs at least one document.")
  if any(not d.strip() for d in documents):
    raise ValueError("a document is empty: every original text must have content to rewrite.")
  prompts = dict(REWRITE_PROMPTS if prompts is None else prompts)
  for name, tpl in prompts.items():
    if "{text}" not in tpl:
      raise ValueError(f"prompt template for '{name}' has no '{{text}}' placeholder.")
  out = {"original": list(documents)}
  for name, tpl in prompts.items():
    answers = list(rewriter([tpl.format(text=d) for d in documents]))
    if len(answers) != len(documents):
      raise ValueError(f"the rewriter returned {len(answers)} answers for {len(documents)} prompts ('{name}').")
    out[name] = [clean_rewrite(a) for a in answers]
  return out


def cached_rewriter(judge, cache=None, max_new_tokens: int = 96, chunk_size: int = 16) -> Callable:
  """A rewriter from an `lm` judge (greedy text), its answers cached in an `lm.GenerationCache`.

  Args:
    judge: `lm.SmolLMJudge` (or anything with `__call__(prompts, max_new_tokens)` and `model_id`).
    cache: `lm.GenerationCache` or None.
    max_new_tokens: longest rewrite.
    chunk_size: prompts per generation call (and per cache write).

  Returns:
    `rewrite(prompts) -> list[str]`.
  """
  from iclr24_jax import lm

  settings = {"kind": "rewrite", "max_new_tokens": int(max_new_tokens), "decoding": "greedy"}

  def rewrite(prompts):
    return lm.cached_map(lambda ps: judge(ps, max_new_tokens=max_new_tokens), prompts, cache,
                         model_id=getattr(judge, "model_id", "judge"), settings=settings, chunk_size=chunk_size)
  return rewrite


def filter_probes(probes: Mapping[str, Sequence[str]], embed_fn: Callable[[list[str]], np.ndarray],
                  rules: Mapping[str, tuple[float, float]] | None = None,
                  answers: Sequence[str] | None = None) -> tuple[dict[str, list], dict]:
  """Rejects failed rewrites by sentence-embedding similarity to the original.

  Args:
    probes: `make_probe_set` output.
    embed_fn: list of texts -> [N, D] unit-norm embeddings (e.g. MiniLM via `lm.embed_sentences`).
    rules: {version: (low, high)} accepted cosine range (default `FILTER_RULES`).
    answers: optional N answers (e.g. the question's 'yes' / 'no'); a style rewrite must keep the answer's word
      when the original text states it (the answer is kept).

  Returns:
    (probes with None in place of each rejected rewrite, report {version: {'accepted', 'total', 'rate',
    'mean_cosine'}}).
  """
  rules = dict(FILTER_RULES if rules is None else rules)
  orig = list(probes["original"])
  n = len(orig)
  e_orig = np.asarray(embed_fn(orig))
  kept: dict[str, list] = {"original": orig}
  report = {}
  for name, texts in probes.items():
    if name == "original":
      continue
    texts = list(texts)
    if len(texts) != n:
      raise ValueError(f"version '{name}' has {len(texts)} texts for {n} originals.")
    lo, hi = rules.get(name, (-1.0, 1.0))
    e = np.asarray(embed_fn([t if t else " " for t in texts]))
    cos = np.sum(e * e_orig, -1)
    ok = np.array([bool(t.strip()) and t.strip() != o.strip() for t, o in zip(texts, orig)])
    ok &= (cos >= lo) & (cos <= hi)
    if answers is not None and name == "style":
      for i, a in enumerate(answers):
        w = str(a).strip().lower()
        if w and re.search(rf"\b{re.escape(w)}\b", orig[i].lower()) and not re.search(rf"\b{re.escape(w)}\b",
                                                                                        texts[i].lower()):
          ok[i] = False
    kept[name] = [t if k else None for t, k in zip(texts, ok)]
    report[name] = {"accepted": int(ok.sum()), "total": n, "rate": float(ok.mean()) if n else float("nan"),
                    "mean_cosine": float(np.mean(cos)) if n else float("nan")}
  return kept, report
