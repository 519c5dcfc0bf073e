"""lm_inversion's data (`papers/lm_inversion/data.py`): target samples cached per prompt and resumed,
the baselines, the derangement, the split by prompt, the prompts deduplicated and capped."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import lm_inversion as li
from iclr24_jax.papers.lm_inversion import data as li_data
from .helpers import needs_data


def test_target_samples_cached_per_prompt_and_resumed(tmp_path):
  """Sampled continuations: cached per prompt (a subset reuses them), a lost batch is regenerated identically."""
  from iclr24_jax import lm
  from iclr24_jax.lm import tokenizer as tok_lib
  tok = tok_lib.train_bpe(["is the sky blue today? can a dog fly over the sea?"] * 4, vocab_size=300)
  assert li_data.special_ids(tok) == [0, 1, 2, 3]  # train_bpe's pad, bos, eos, unk: forbidden in the samples
  cfg = lm.tiny_config(vocab_size=tok.vocab_size)
  params = lm.init_params(jax.random.key(0), cfg)
  prompts = ["is the sky blue", "can a dog fly", "the sea", "a dog", "blue sky today"]
  kw = dict(model_id="tiny", max_tokens=8, new_tokens=3, batch_size=2)
  texts = li.target_samples(params, cfg, tok, prompts, str(tmp_path), **kw)
  assert len(texts) == 5 and all(t.strip() for t in texts)
  import glob, json
  (path,) = glob.glob(str(tmp_path / "samples_*.json"))
  with open(path) as f:
    data = json.load(f)
  assert data["texts"] == dict(zip(prompts, texts))
  del data["texts"]["the sea"], data["texts"]["a dog"]  # the second batch was lost: it is regenerated the same
  with open(path, "w") as f:
    json.dump(data, f)
  assert li.target_samples(params, cfg, tok, prompts, str(tmp_path), **kw) == texts
  assert li.target_samples(None, cfg, tok, prompts[3:], str(tmp_path), **kw) == texts[3:]  # all cached: no LM


def test_baselines():
  rng = np.random.default_rng(0)
  train = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(6, 50)) * 2), -1))
  test = train[[4, 1]] + 0.01 * rng.normal(size=(2, 50))
  np.testing.assert_array_equal(li.nearest_by_kl(test, train, block=1), [4, 1])

  class Tok:
    def decode(self, ids):
      return f" w{ids[0]}"

  lp = np.log(np.array([[0.1, 0.6, 0.3]]))
  assert li.bag_of_top_tokens(lp, np.zeros(3), Tok(), k=2) == ["w1 w2"]
  # against the unigram estimate token 2 is raised most
  assert li.bag_of_top_tokens(lp, np.log(np.array([0.1, 0.9, 0.05])), Tok(), k=1) == ["w2"]


def test_derangement_is_a_permutation_without_fixed_points():
  """Every row of a shuffled control reads another row, and each row is read exactly once (the same inputs as the
  unshuffled arm, reassigned), for the sizes where a uniform permutation often has fixed points."""
  from iclr24_jax.papers.lm_inversion import data as data_lib
  for n in (2, 3, 5, 500):
    for seed in range(20):
      perm = data_lib.derangement(n, seed)
      np.testing.assert_array_equal(np.sort(perm), np.arange(n))
      assert (perm != np.arange(n)).all(), (n, seed, perm)
  np.testing.assert_array_equal(data_lib.derangement(2, 0), [1, 0])          # the only derangement of 2
  with pytest.raises(ValueError, match="at least 2"):
    data_lib.derangement(1)


def test_split_is_by_prompt_and_errors():
  prompts = [f"q{i}" for i in range(20)]
  train, test = li.split_prompts(prompts, 5)
  assert len(test) == 5 and len(train) == 15 and not set(train) & set(test)
  with pytest.raises(ValueError, match="unique"):
    li.split_prompts(["a", "a", "b"], 1)
  with pytest.raises(ValueError, match="no training prompt"):
    li.split_prompts(prompts, 20)


@needs_data
def test_prompts_are_deduplicated_and_capped():
  from iclr24_jax.lm import tokenizer as tok_lib
  tok = tok_lib.train_bpe(["Is the sky blue? Can a dog fly?"] * 3, vocab_size=300)
  prompts = li_data.load_prompts(tok, max_tokens=16, sources=("obqa",))
  assert len(prompts) == len(set(prompts)) > 400
  assert max(len(tok.encode(p)) for p in prompts) <= 17  # the cut text re-encodes to about its 16 tokens
