"""Prompts, the target LM's next-token distributions (cached on disk), and the non-learned baselines.

Prompts are the real questions and instructions beside the project: StrategyQA, QuaRel and OpenBookQA questions
(`../shared/data/mario`, every split) and the LLMBar instructions, deduplicated, cut to their first 64 target-LM
tokens, and split into train / test BY PROMPT (no prompt text is in both).

The target LM is SmolLM2-135M-Instruct (lm.load_smollm2); its distribution after the raw prompt text (no chat
template) is what the inverter sees. Distributions are cached as float16 rows of a .npy memmap keyed by the model,
the prompts and the length cap, filled in order and resumable (a progress file records the rows done).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import textdata
from iclr24_jax.lm import scoring


def load_prompts(tokenizer: Any, max_tokens: int = 64, data_dir: str | None = None,
                 sources: Sequence[str] = ("strategyqa", "quarel", "obqa", "llmbar")) -> list[str]:
  """Unique prompts, each cut to its first `max_tokens` target-LM tokens, in a fixed order.

  Args:
    tokenizer: the target LM's tokenizer (lengths are counted in its tokens).
    max_tokens: the cap (64 in the issue's setting).
    data_dir: the shared data folder (None: found beside the project / $ICLR24_DATA).
    sources: which sets to read.

  Returns:
    Deduplicated prompt strings (after the cut, whitespace-stripped, empty ones dropped), in source order.
  """
  texts: list[str] = []
  mario_dir = None if data_dir is None else os.path.join(data_dir, "mario")
  for src in sources:
    if src in textdata.MARIO_SETS:
      for split in textdata.MARIO_SPLITS[src]:
        texts += [r["question"] for r in textdata.load_mario(src, split, data_dir=mario_dir)]
    elif src == "llmbar":
      texts += [r["input"] for r in textdata.load_llmbar(
          data_dir=None if data_dir is None else os.path.join(data_dir, "llmbar"))]
    else:
      raise ValueError(f"unknown prompt source {src!r}; choose from {textdata.MARIO_SETS + ('llmbar',)}.")
  seen, out = set(), []
  for t in texts:
    ids = tokenizer.encode(t)[:max_tokens]
    cut = tokenizer.decode(ids).strip()
    if cut and cut not in seen:
      seen.add(cut)
      out.append(cut)
  return out


def split_prompts(prompts: Sequence[str], num_test: int, num_train: int | None = None, seed: int = 0
                  ) -> tuple[list[str], list[str]]:
  """A seeded split by prompt (the lists are disjoint as strings).

  Args:
    prompts: unique prompts.
    num_test: test prompts.
    num_train: train prompts (None: all the rest).
    seed: shuffle seed.

  Returns:
    (train, test).
  """
  if len(set(prompts)) != len(prompts):
    raise ValueError("prompts must be unique to split by prompt; deduplicate them first (load_prompts does).")
  if num_test >= len(prompts):
    raise ValueError(f"num_test={num_test} leaves no training prompt out of {len(prompts)}.")
  order = np.random.default_rng(seed).permutation(len(prompts))
  test = [prompts[i] for i in order[:num_test]]
  rest = order[num_test:] if num_train is None else order[num_test:num_test + num_train]
  return [prompts[i] for i in rest], test


def _key(model_id: str, prompts: Sequence[str], max_tokens: int) -> str:
  h = hashlib.sha1(model_id.encode())
  h.update(str(max_tokens).encode())
  for p in prompts:
    h.update(p.encode())
    h.update(b"\x00")
  return h.hexdigest()[:16]


def target_distributions(params: Any, config: Any, tokenizer: Any, prompts: Sequence[str], cache_dir: str,
                         model_id: str = "smollm2-135m-instruct", max_tokens: int = 64, batch_size: int = 32,
                         progress: Callable[[int, int], None] | None = None) -> np.ndarray:
  """Next-token log-distributions of the target LM after each prompt, cached as float16.

  Args:
    params, config: the target LM (lm.llama).
    tokenizer: its tokenizer.
    prompts: N prompt strings.
    cache_dir: folder for the cache (created); the file name is a hash of model_id, prompts and max_tokens.
    model_id: names the model in the cache key.
    max_tokens: prompts are encoded to at most this many tokens (one compiled shape [batch_size, max_tokens]).
    batch_size: prompts per forward.
    progress: optional callback (done, total).

  Returns:
    [N, V] float16 memmap (read-only view) of log-probabilities.
  """
  os.makedirs(cache_dir, exist_ok=True)
  stem = pathlib.Path(cache_dir) / f"dist_{_key(model_id, prompts, max_tokens)}"
  path, state_path = stem.with_suffix(".npy"), stem.with_suffix(".json")
  n, v = len(prompts), int(config.vocab_size)
  done = 0
  if path.exists() and state_path.exists():
    with open(state_path) as f:
      done = int(json.load(f)["rows_done"])
    out = np.lib.format.open_memmap(path, mode="r+")
    if out.shape != (n, v):
      done, out = 0, None
  else:
    out = None
  if out is None:
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, v))
  if done < n:
    fn = jax.jit(lambda ids, mask: scoring.next_token_logprobs(params, config, ids, mask))
    for start in range(done - done % batch_size, n, batch_size):
      chunk = list(prompts[start:start + batch_size])
      real = len(chunk)
      chunk += [chunk[-1]] * (batch_size - real)  # pad the last batch: one compiled shape
      ids, mask = tokenizer.encode_batch(chunk, max_len=max_tokens, truncation="right")
      lp = np.asarray(fn(jnp.asarray(ids), jnp.asarray(mask)))
      out[start:start + real] = lp[:real].astype(np.float16)
      out.flush()
      with open(state_path, "w") as f:
        json.dump({"rows_done": start + real, "num_prompts": n}, f)
      if progress is not None:
        progress(start + real, n)
  del out
  return np.load(path, mmap_mode="r")


def special_ids(tokenizer: Any) -> list[int]:
  """Ids of the tokenizer's special (control) tokens (SmolLM2: 0..16), falling back to pad/bos/eos.

  Args:
    tokenizer: an `lm.tokenizer.Tokenizer`.

  Returns:
    Sorted list of ids (forbidden when sampling the continuations).
  """
  try:
    return sorted(int(k) for k, v in tokenizer.backend.get_added_tokens_decoder().items() if v.special)
  except AttributeError:
    return sorted({int(i) for i in (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) if i is not None})


def target_samples(params: Any, config: Any, tokenizer: Any, prompts: Sequence[str], cache_dir: str,
                   model_id: str = "smollm2-135m-instruct", max_tokens: int = 64, new_tokens: int = 16,
                   temperature: float = 1.0, seed: int = 0, batch_size: int = 32,
                   progress: Callable[[int, int], None] | None = None) -> list[str]:
  """Text the target LM samples after each prompt (the sample-inversion baseline's input), cached per prompt.

  The paper's "sample inversion" baseline reads the LM's generated text instead of its distribution. Here each
  prompt (raw text, no chat template, as for `target_distributions`) gets `new_tokens` tokens sampled at
  `temperature` with the special tokens forbidden (so every continuation has `new_tokens` real tokens: the
  instruct model otherwise often ends the turn at once).
  # Deviation: one short continuation (16 tokens) per prompt; the paper samples full responses from Llama-2.

  The cache is one JSON file per (model_id, max_tokens, new_tokens, temperature, seed) mapping prompt -> text, so
  any subset or superset of prompts reuses what was generated; it is written after every batch (resumable).
  A batch's sampling key is fold_in(key(seed), crc32 of its first prompt).

  Args:
    params, config: the target LM (lm.llama; `fuse_params` form is fastest).
    tokenizer: its tokenizer.
    prompts: N prompt strings.
    cache_dir: folder for the cache (created).
    model_id: names the model in the cache key.
    max_tokens: prompt length cap (left-padded to it: one compiled shape [batch_size, max_tokens]).
    new_tokens: tokens generated per prompt.
    temperature: sampling temperature (0: greedy).
    seed: the sampling seed.
    batch_size: prompts per generation call.
    progress: optional callback (done, total).

  Returns:
    N continuation strings (special tokens skipped, not stripped).
  """
  import zlib

  from iclr24_jax.lm import generation
  if new_tokens < 1:
    raise ValueError(f"new_tokens must be >= 1, got {new_tokens}.")
  os.makedirs(cache_dir, exist_ok=True)
  tag = f"{model_id}|samples|{new_tokens}|{temperature}|{seed}"
  path = pathlib.Path(cache_dir) / f"samples_{_key(tag, [], max_tokens)}.json"
  cache: dict[str, str] = {}
  if path.exists():
    with open(path) as f:
      cache = dict(json.load(f)["texts"])
  todo = list(dict.fromkeys(p for p in prompts if p not in cache))
  if todo:
    bias = generation.bias_vector({i: -1e9 for i in special_ids(tokenizer)}, int(config.vocab_size))
    fn = jax.jit(lambda ids, mask, key: generation.generate(
        params, config, ids, mask, key, int(new_tokens), temperature=float(temperature),
        logit_bias=jnp.asarray(bias), pad_id=int(tokenizer.pad_id)))
    for start in range(0, len(todo), batch_size):
      chunk = todo[start:start + batch_size]
      real = len(chunk)
      chunk = chunk + [chunk[-1]] * (batch_size - real)
      ids, mask = tokenizer.encode_batch(chunk, max_len=max_tokens, padding="left", truncation="right")
      key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(chunk[0].encode()) & 0x7FFFFFFF)
      out = fn(jnp.asarray(ids), jnp.asarray(mask), key)
      texts = tokenizer.decode_batch(np.asarray(out.tokens)[:real], np.asarray(out.mask)[:real])
      cache.update(zip(chunk[:real], texts))
      tmp = path.with_suffix(".tmp")
      with open(tmp, "w") as f:
        json.dump({"texts": cache, "model_id": model_id, "new_tokens": new_tokens, "temperature": temperature,
                   "seed": seed, "max_tokens": max_tokens}, f)
      os.replace(tmp, path)
      if progress is not None:
        progress(start + real, len(todo))
  return [cache[p] for p in prompts]


def derangement(n: int, seed: int = 1) -> np.ndarray:
  """A random permutation of 0..n-1 with no fixed point: row i of a shuffled control reads row perm[i] != i.

  A uniform permutation, then each fixed point i swapped with its right neighbour (cyclically): the swap keeps a
  permutation and leaves neither place fixed (position i gets perm[i + 1], which is not i since i sat at i).

  Args:
    n: number of rows, >= 2.
    seed: numpy seed.

  Returns:
    [n] int permutation with perm[i] != i for every i.

  Raises:
    ValueError: n < 2 (one row has no other row to read).
  """
  if int(n) < 2:
    raise ValueError(f"a shuffled control needs at least 2 rows (another row to read), got n={n}.")
  perm = np.random.default_rng(seed).permutation(int(n))
  for i in range(int(n)):
    if perm[i] == i:
      j = (i + 1) % int(n)
      perm[i], perm[j] = perm[j], perm[i]
  return perm


def bag_of_top_tokens(logprobs: np.ndarray, unigram: np.ndarray, tokenizer: Any, k: int = 10) -> list[str]:
  """Baseline: the k tokens most raised above the unigram estimate, decoded one by one and joined by spaces.

  Args:
    logprobs: [B, V] target-LM log-distributions.
    unigram: [V] the unigram estimate (what `v - unigram` is measured against, as the inverter sees it).
    tokenizer: the target LM's tokenizer.
    k: tokens per guess.

  Returns:
    B guesses.
  """
  scores = np.asarray(logprobs, np.float32) - np.asarray(unigram, np.float32)[None]
  top = np.argsort(-scores, axis=1)[:, :k]
  return [" ".join(w for w in (tokenizer.decode([int(t)]).strip() for t in row) if w) for row in top]


def nearest_by_kl(test_logprobs: np.ndarray, train_logprobs: np.ndarray, block: int = 64) -> np.ndarray:
  """Baseline: for each test distribution p, the training prompt whose distribution q minimises KL(p || q).

  KL(p || q) = sum_v p_v (log p_v - log q_v); the first term does not depend on q, so the argmin is the argmax of
  p @ log q^T, computed in blocks of test rows.

  Args:
    test_logprobs: [N, V] log-distributions.
    train_logprobs: [M, V] log-distributions.
    block: test rows per matrix product.

  Returns:
    [N] indices into the training prompts.
  """
  q = jnp.asarray(np.asarray(train_logprobs, np.float32))
  idx = []
  for s in range(0, len(test_logprobs), block):
    p = jnp.exp(jnp.asarray(np.asarray(test_logprobs[s:s + block], np.float32)))
    idx.append(np.asarray(jnp.argmax(p @ q.T, axis=1)))
  return np.concatenate(idx)


def encode_labels(tok: Any, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
  """Decoder targets: the text's tokens then EOS, cut to `length` (EOS kept last), right-padded.

  Args:
    tok: the decoder tokenizer; texts: N prompts; length: T.

  Returns:
    (labels [N, length] int32, label_mask [N, length] bool).
  """
  labels = np.full((len(texts), length), tok.pad_id, np.int32)
  mask = np.zeros((len(texts), length), bool)
  for i, t in enumerate(texts):
    ids = tok.encode(t, add_bos=False)[: length - 1] + [tok.eos_id]
    labels[i, :len(ids)] = ids
    mask[i, :len(ids)] = True
  return labels, mask


def encode_samples(tok: Any, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
  """The sample-inversion encoder input: continuations in the decoder's tokens, cut / right-padded to `length`.

  Args:
    tok: the decoder tokenizer; texts: N continuations (an empty one becomes "."); length: L.

  Returns:
    (ids [N, length] int32, mask [N, length] bool; every row has at least one real token).
  """
  ids, mask = tok.encode_batch([t if t.strip() else "." for t in texts], max_len=length, truncation="right",
                               add_bos=False)
  if ids.shape[1] < length:
    pad = length - ids.shape[1]
    ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=tok.pad_id)
    mask = np.pad(mask, ((0, 0), (0, pad)))
  return ids.astype(np.int32), mask.astype(bool)


# ----------------------------------------------------------------------------------------------------------
# The paper's prompt sets in the HF hub's on-disk layouts (parquet shards or `save_to_disk` folders).

DATASETS = {
    "one_million_instructions": "wentingzhao/one-million-instructions (the inverter's training prompts, vec2text "
                                "dataset_name 'one_million_instructions'): data/train-*.parquet with columns system, "
                                "user; prompt = system.strip() + '\\n\\n' + user.strip(); 1% held out",
    "anthropic_hh_first_prompt": "wentingzhao/anthropic-hh-first-prompt (the paper's out-of-distribution "
                                 "'Anthropic HH' prompts): data/train-*.parquet with column user",
    "python_code_alpaca": "iamtarun/python_code_instructions_18k_alpaca (the 'Alpaca code' prompts): "
                          "data/train-*.parquet with column instruction",
}
DATASET_ALIASES = {"instructions_2m": "one_million_instructions", "anthropic_toxic_prompts": "anthropic_hh_first_prompt"}
DATASETS.update({alias: f"alias of '{name}'" for alias, name in DATASET_ALIASES.items()})
_COLUMNS = {"one_million_instructions": ("system", "user"), "anthropic_hh_first_prompt": ("user",),
            "python_code_alpaca": ("instruction",)}
HF_SOURCE = ("`git clone` of the data set's hub repository (datasets/<owner>/<name>), or "
             "`datasets.load_dataset(<owner>/<name>).save_to_disk(<dir>)` where the hub is reachable")


def load(data_config) -> dict[str, list[str]]:
  """The prompts of `config.data.name`, as the official vec2text code builds them.

  Args:
    data_config: config.data with `name` (a key of DATASETS or DATASET_ALIASES), `data_dir` (the data set's
      folder) and optionally `test_fraction` (default 0.01, vec2text's train_test_split) and `seed`.

  Returns:
    {'train': [prompt, ...], 'test': [...]}: one_million_instructions is split by a seeded permutation into
    (1 - test_fraction) / test_fraction; the evaluation sets are all 'test'.

  Raises:
    ValueError: unknown name. common.data.DataNotFoundError: no train split in data_dir.
    common.data.DataFormatError: the parquet lacks the columns.
  """
  from iclr24_jax.common import data as data_lib
  name = data_lib.config_value(data_config, "name")
  name = DATASET_ALIASES.get(name, name)
  if name not in DATASETS:
    raise ValueError(f"unknown LM-inversion data set '{name}'; choose one of {sorted(DATASETS)} "
                     f"(aliases {sorted(DATASET_ALIASES)}).")
  root = data_lib.locate_data(data_config, name, what=name, layout=DATASETS[name], source=HF_SOURCE)
  rows = data_lib.read_hf_split(root, "train", what=name, required_columns=_COLUMNS[name], source=HF_SOURCE)
  if name == "one_million_instructions":   # vec2text create_ompi_ex
    texts = [r["system"].strip() + "\n\n" + r["user"].strip() for r in rows]
  else:
    texts = [str(r[_COLUMNS[name][0]]) for r in rows]
  if name != "one_million_instructions":
    return {"train": [], "test": texts}
  # Deviation: vec2text holds out 1% with datasets' train_test_split (its own RNG); a seeded numpy permutation
  # holds out the same share here.
  frac = float(data_lib.config_value(data_config, "test_fraction", 0.01))
  perm = np.random.default_rng(int(data_lib.config_value(data_config, "seed", 0))).permutation(len(texts))
  n_test = max(1, int(round(frac * len(texts))))
  return {"train": [texts[i] for i in perm[n_test:]], "test": [texts[i] for i in perm[:n_test]]}
