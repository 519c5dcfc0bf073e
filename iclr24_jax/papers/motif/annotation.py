"""Motif's annotation step: an LLM's preference over pairs of captions, cached on disk and resumable.

Prompt: the official 'default' template (rlaif/prompts.py) with a task description (the paper's
"defaultgoal" string for NetHack, or any text) and the two captions. Two ways to read the LLM's answer:

- 'logprob' (default): both presentation orders, the log-probabilities of the answers "1" and "2" after the
  answer prefix `("best_description": `, debiased over the orders (`lm.choice_logprobs` +
  `lm.debiased_preference`); |margin| < tau is no preference. A 135M model's generated answers are constant,
  so its text cannot be parsed into useful labels; its log-odds can still carry a signal.
- 'generate': the official path: sample an answer (temperature 0.1, top-p 0.95), parse it with the official
  regular expression, and on failure ask once more with the retry prompt (`parse_preference`).

Labels follow the official AnnotationIdx: 0 = first caption better, 1 = second better, 2 = no preference,
None = unparsable after the retry (dropped from training). Identical captions are a tie without asking the LLM
(as the official annotator does).

The cache is a JSONL file, one line per annotated pair, appended and flushed as soon as each chunk of pairs is
done; a run that is interrupted and restarted annotates only the pairs it has not stored yet.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np

from iclr24_jax.common import jsonl_cache

# The official prompt (rlaif/prompts.py, version 'default'), a fact of the paper's method.
SYSTEM_PROMPT = ("You are a helpful and honest judge of good gameplaying and progress in the NetHack game. Always "
                 "answer as helpfully as possible, while being truthful.\n\nIf you don't know the answer to a "
                 "question, please don't share false information.")
PROMPT_TEMPLATE = """
I will present you with two short gameplay descriptions.
First, tell me about your knowledge of NetHack. Mention the goal of NetHack. {task}
Then, write an analysis describing the semantics of each description strictly using information from the descriptions (which may be empty) and your knowledge of NetHack.
Provide a comparative analysis based on first princicples.
Finally, respond by explicitly declaring which one is the most likely to make some progress towards the goal, writing either ("best_description": 1), ("best_description": 2). You could also say ("best_description": None).

{{
"description_1":
"{caption_1}"
}}

{{
"description_2":
"{caption_2}"
}}
"""
RETRY_PROMPT = ('\nSo, which one is the best? Please respond by saying ("best_description": 1), '
                '("best_description": 2), or ("best_description": None).')
GOALS = {
    "defaultgoal": ("Prefer agents that maximize the score in the game, for instance by killing monsters, "
                    "collecting gold or going down the stairs in the dungeon."),
    "zeroknowledge": "",
}
ANSWER_PREFIX = '("best_description": '
OPTIONS = ("1", "2")
# The official answer pattern, case-insensitive: 'best_description' (underscores / spaces allowed), any
# punctuation, an optional colon and one optional word, then 1, 2 or None.
ANSWER_RE = re.compile(r"\W*best_*\s*description\W*(?:\s*:*\s*)?(?:\w+\s*)?(1|2|none)", re.IGNORECASE)
FIRST, SECOND, TIE = 0, 1, 2


def annotation_prompt(caption_1: str, caption_2: str, task: str = "defaultgoal") -> str:
  """The user message asking which caption shows more progress (official 'default' template).

  Args:
    caption_1, caption_2: the two captions (may be empty).
    task: a key of GOALS ('defaultgoal', 'zeroknowledge') or the task description itself.

  Returns:
    The prompt text (render it with the model's chat template before scoring).
  """
  if not isinstance(caption_1, str) or not isinstance(caption_2, str):
    raise TypeError(f"captions must be str, got {type(caption_1).__name__} and {type(caption_2).__name__}.")
  goal = GOALS.get(task, task)
  return PROMPT_TEMPLATE.format(task=goal, caption_1=caption_1, caption_2=caption_2)


def parse_preference(text: str) -> int | None:
  """Reads the answer of a generated annotation.

  Returns:
    0 if the answer names description 1, 1 for description 2, 2 for None (no preference), and None when the
    text has no answer in the official format (the caller then asks again with RETRY_PROMPT).
  """
  if not isinstance(text, str):
    return None
  m = ANSWER_RE.search(text)
  if m is None:
    return None
  v = m.group(1).lower()
  return FIRST if v == "1" else (SECOND if v == "2" else TIE)


def label_from_margin(margin: float, tau: float) -> int:
  """Debiased log-odds that the first caption is better -> label (|margin| < tau: no preference).

  Args:
    margin: debiased log-odds (finite float); > 0 favours the first caption.
    tau: no-preference band (>= 0).

  Returns:
    FIRST (0), SECOND (1) or TIE (2).

  Raises:
    ValueError: a non-finite margin.
  """
  if not np.isfinite(margin):
    raise ValueError(f"annotation margin must be finite, got {margin}.")
  return TIE if abs(margin) < tau else (FIRST if margin > 0 else SECOND)


class AnnotationCache(jsonl_cache.JsonlCache):
  """Annotations keyed by (judge name, task, caption_1, caption_2): a `common.jsonl_cache.JsonlCache` (append-only
  JSON lines, a line torn by an interruption skipped and annotated again).

  Args:
    path: the file (created with its folder on first write); None keeps annotations in memory only.
  """

  @staticmethod
  def key(judge: str, task: str, caption_1: str, caption_2: str) -> str:
    """The cache key of one annotation: SHA-256 hex digest of [judge, task, caption_1, caption_2]."""
    return jsonl_cache.digest([judge, task, caption_1, caption_2])


Judge = Callable[[Sequence[tuple[str, str]], str], list[dict]]


def annotate_pairs(pairs: Sequence[tuple[str, str]], task: str, judge: Judge, judge_name: str,
                   cache: AnnotationCache | None = None, chunk_size: int = 16,
                   progress: Callable[[int, int], None] | None = None) -> list[dict]:
  """Annotates caption pairs, reusing and extending the cache.

  Args:
    pairs: [(caption_1, caption_2), ...] (repeats are annotated once).
    task: the task description passed to the prompt.
    judge: (pairs, task) -> one dict per pair with 'label' (0/1/2/None) and optionally 'margin' / 'text'.
    judge_name: identifies the judge in the cache key (model + mode + settings).
    cache: an AnnotationCache (None: in memory).
    chunk_size: pairs per judge call; each finished chunk is written before the next starts.
    progress: optional callback (done, total) after each chunk.

  Returns:
    One record per input pair: {'caption_1', 'caption_2', 'label', 'margin', 'cached'}.
  """
  cache = cache if cache is not None else AnnotationCache(None)
  keys = [AnnotationCache.key(judge_name, task, a, b) for a, b in pairs]
  ties = {k: dict(caption_1=a, caption_2=b, label=TIE, margin=0.0, judge=judge_name)
          for k, (a, b) in zip(keys, pairs) if a == b and k not in cache}
  cache.put_many(ties)   # official: identical captions are a tie without an LLM call
  fresh = {k for k in keys if k not in cache}

  def annotate(chunk: list[tuple[str, str]]) -> list[dict]:
    results = judge(chunk, task)
    if len(results) != len(chunk):
      raise ValueError(f"judge returned {len(results)} results for {len(chunk)} pairs.")
    recs = []
    for (a, b), res in zip(chunk, results):
      lab = res.get("label")
      if lab not in (FIRST, SECOND, TIE, None):
        raise ValueError(f"judge label must be 0, 1, 2 or None, got {lab!r}.")
      recs.append(dict(caption_1=a, caption_2=b, label=lab, margin=res.get("margin"), judge=judge_name,
                       **({"text": res["text"]} if "text" in res else {})))
    return recs

  recs = jsonl_cache.cached_map(annotate, [tuple(p) for p in pairs], keys, cache, chunk_size=chunk_size,
                                progress=progress, what="pair")
  return [dict(caption_1=a, caption_2=b, label=r["label"], margin=r.get("margin"), cached=k not in fresh)
          for k, (a, b), r in zip(keys, pairs, recs)]


# ------------------------------------------------------------------------------------------------- judges
def _choice_logprobs(params, config, tok, prompts: list[str], options: Sequence[str], batch_size: int,
                     widths: Sequence[int] | None) -> np.ndarray:
  from iclr24_jax import lm
  if hasattr(lm, "choice_logprobs"):
    kw = {} if widths is None else {"widths": tuple(widths)}
    return np.asarray(lm.choice_logprobs(params, config, tok, prompts, list(options), batch_size=batch_size, **kw))
  # Before lm.choice_logprobs existed: the same numbers from score_continuations (one prompt+option per row).
  rep_p = [p for p in prompts for _ in options]
  rep_o = [o for _ in prompts for o in options]
  s = lm.score_continuations(params, config, tok, rep_p, rep_o, batch_size=batch_size)["sum_logprob"]
  return np.asarray(s).reshape(len(prompts), len(options))


def _debiased(ab: np.ndarray, ba: np.ndarray) -> np.ndarray:
  from iclr24_jax import lm
  if hasattr(lm, "debiased_preference"):
    return np.asarray(lm.debiased_preference(ab, ba), np.float64)
  return 0.5 * ((ab[:, 0] - ab[:, 1]) + (ba[:, 1] - ba[:, 0]))


def chat_prompts(tok: Any, user_messages: Sequence[str], answer_prefix: str = ANSWER_PREFIX,
                 system: str | None = None) -> list[str]:
  """Renders user messages with the tokenizer's chat template and appends the answer prefix.

  Args:
    tok: the LM's Tokenizer (apply_chat_template).
    user_messages: N user messages (str).
    answer_prefix: text appended after the assistant header (the start of the judge's answer).
    system: system prompt (None: the template's default).

  Returns:
    N prompt strings.
  """
  return [tok.apply_chat_template(m, add_generation_prompt=True, system=system) + answer_prefix
          for m in user_messages]


class LogprobJudge:
  """The default annotator: debiased log-odds of "1" vs "2" over both presentation orders.

  Args:
    params, config, tok: a causal LM (e.g. `lm.load_smollm2()`; pass `lm.fuse_params(params)` for speed).
    tau: |margin| below this is no preference (label 2).
    system: system prompt (experiments pass the official SYSTEM_PROMPT; None: the model's default).
    batch_size: prompts per compiled call.
    widths: padded prompt widths for lm.choice_logprobs (None: its defaults).
  """

  def __init__(self, params: Any, config: Any, tok: Any, tau: float = 0.1, system: str | None = None,
               batch_size: int = 8, widths: Sequence[int] | None = None):
    self.params, self.config, self.tok = params, config, tok
    self.tau, self.system, self.batch_size, self.widths = float(tau), system, batch_size, widths
    self.calls = 0

  def margins(self, pairs: Sequence[tuple[str, str]], task: str) -> np.ndarray:
    """[N] debiased log-odds that the first caption of each pair is better.

    Args:
      pairs: N (caption_1, caption_2) string pairs.
      task: the task description in the annotation prompt.

    Returns:
      float64 [N] margins (> 0 favours caption_1).
    """
    # Deviation: the official samples a chain-of-thought answer and parses it (GenerateJudge); a 135M model's
    # answers are constant, so the default reads the answer's log-probabilities in both orders instead.
    ab = chat_prompts(self.tok, [annotation_prompt(a, b, task) for a, b in pairs], system=self.system)
    ba = chat_prompts(self.tok, [annotation_prompt(b, a, task) for a, b in pairs], system=self.system)
    lp = _choice_logprobs(self.params, self.config, self.tok, ab + ba, OPTIONS, self.batch_size, self.widths)
    self.calls += 1
    return _debiased(lp[:len(pairs)], lp[len(pairs):])

  def __call__(self, pairs: Sequence[tuple[str, str]], task: str) -> list[dict]:
    m = self.margins(pairs, task)
    return [dict(label=label_from_margin(float(x), self.tau), margin=float(x)) for x in m]


class GenerateJudge:
  """The official generate-and-parse annotator (temperature 0.1, top-p 0.95, one retry with RETRY_PROMPT).

  Args:
    generate: list of chat-rendered prompts -> list of generated texts (e.g. a wrapped `lm.Generator`).
    tok: tokenizer with `apply_chat_template`.
    system: system prompt (None: the model's default).
  """

  def __init__(self, generate: Callable[[list[str]], list[str]], tok: Any, system: str | None = None):
    self.generate, self.tok, self.system = generate, tok, system

  def __call__(self, pairs: Sequence[tuple[str, str]], task: str) -> list[dict]:
    users = [annotation_prompt(a, b, task) for a, b in pairs]
    prompts = [self.tok.apply_chat_template(u, add_generation_prompt=True, system=self.system) for u in users]
    texts = self.generate(prompts)
    labels = [parse_preference(t) for t in texts]
    retry = [i for i, l in enumerate(labels) if l is None]
    if retry:
      convs = [[{"role": "user", "content": users[i]}, {"role": "assistant", "content": texts[i]},
                {"role": "user", "content": RETRY_PROMPT}] for i in retry]
      again = self.generate([self.tok.apply_chat_template(c, add_generation_prompt=True, system=self.system)
                             for c in convs])
      for i, t in zip(retry, again):
        labels[i] = parse_preference(t)
        texts[i] = texts[i] + "\n[retry] " + t
    return [dict(label=l, text=t) for l, t in zip(labels, texts)]


class OracleJudge:
  """A judge from a value per caption (higher = better): the toy world's oracle, and a fake judge for tests.

  Args:
    value: caption -> float.
  """

  def __init__(self, value: Callable[[str], float]):
    self.value = value
    self.calls = 0

  def __call__(self, pairs: Sequence[tuple[str, str]], task: str) -> list[dict]:
    del task
    self.calls += 1
    out = []
    for a, b in pairs:
      va, vb = self.value(a), self.value(b)
      out.append(dict(label=FIRST if va > vb else (SECOND if vb > va else TIE), margin=float(va - vb)))
    return out
