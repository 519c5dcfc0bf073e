"""lm_inversion: Language Model Inversion (Morris, Zhao, Chiu, Shmatikov, Rush; ICLR 2024).

Recovering a hidden prompt from the target LM's next-token distribution: the distribution (minus a unigram
estimate) is unrolled into pseudo-embeddings, projected, and read by a T5 encoder whose decoder writes the prompt.

  from iclr24_jax.papers import lm_inversion
  x = lm_inversion.unroll(logprobs, unigram, width=256)           # [B, ceil(V/256), 256]
  params = lm_inversion.init_params(key, inverter)                # inverter = lm_inversion.Inverter(t5_config, ...)
  loss, m = lm_inversion.loss_fn(params, batch, key, inverter=inverter)
  out = lm_inversion.invert(params, logprobs, unigram, inverter=inverter, max_len=64)
  lm_inversion.metrics(predictions, references)                    # bleu, token_f1, exact_match
"""
from iclr24_jax.papers.lm_inversion.data import (bag_of_top_tokens, derangement, load_prompts, nearest_by_kl,
                                                 split_prompts, target_distributions, target_samples)
from iclr24_jax.papers.lm_inversion.evaluation import metrics, per_example, sentence_bleu, token_f1
from iclr24_jax.papers.lm_inversion.model import (Inverter, Projection, embed, init, init_params, init_sample_state,
                                                  invert, invert_samples, loss_fn, make_multi_train_step,
                                                  make_sample_train_step, make_train_step, num_chunks,
                                                  sample_loss_fn, topk_access, unroll, update_unigram)

TITLE = "Language Model Inversion"
URL = "https://openreview.net/forum?id=t9dWHpGkPj"
CODE = "https://github.com/jxmorris12/vec2text"
BIBTEX = """@inproceedings{morris2024language,
  title     = {Language Model Inversion},
  author    = {Morris, John X. and Zhao, Wenting and Chiu, Justin T. and Shmatikov, Vitaly and Rush, Alexander M.},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=t9dWHpGkPj}
}"""

__all__ = [
    "unroll", "update_unigram", "num_chunks", "topk_access", "Inverter", "Projection", "init", "init_params", "embed",
    "loss_fn", "make_train_step", "invert", "metrics", "per_example", "sentence_bleu", "token_f1", "load_prompts",
    "split_prompts", "target_distributions", "target_samples", "bag_of_top_tokens", "nearest_by_kl", "derangement",
    "make_multi_train_step", "sample_loss_fn", "make_sample_train_step", "init_sample_state", "invert_samples",
    "TITLE", "URL", "CODE", "BIBTEX",
]
