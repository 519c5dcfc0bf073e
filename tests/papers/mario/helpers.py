"""Constants shared by the MARIO test modules: a tiny Llama config and texts."""
from iclr24_jax.lm import llama
from iclr24_jax.papers import mario


CFG = llama.tiny_config(vocab_size=320, max_seq_len=256)
TEXTS = ["Can a cat swim? Cats can swim but most do not like water. So the answer is yes.",
         "Is the sun a planet? The sun is a star, not a planet. So the answer is no.",
         "Do fish breathe air? Most fish breathe water through gills. So the answer is no."] * 20


def _coded_batch(tok, with_codes=True):
  codes = mario.ControlCodes.from_tokenizer(tok)
  qs = ["Can a cat swim?", "Is the sun a planet?", "Do fish breathe air?", "Can a cat swim?"]
  rs = ["Cats can swim. So the answer is yes.", "The sun is a star. So the answer is no.",
        "Gills. So the answer is no.", "Most cats dislike water. So the answer is no."]
  pre = [mario.control_prefix(codes.best(), codes), mario.control_prefix(codes.worst(), codes)] * 2
  return codes, qs, rs, mario.encode_examples(tok, qs, rs, pre if with_codes else None, max_len=64)
