"""MaRio: Tailoring Self-Rationalizers with Multi-Reward Distillation (Ramnath et al., ICLR 2024).

A small LM learns to write "RATIONALE So the answer is ANSWER." by SFT on silver (GPT-3) rationales, then by
Quark-style multi-reward conditioning: samples are scored by several rewards (plausibility, diversity,
consistency, task accuracy), each reward's pool is cut into quantile bins, the bins become control codes placed
first in the response, and the policy is trained on NLL(response | codes) + beta KL(pi || pi_ref) - entropy.
Inference conditions on the best bin of every reward.

  from iclr24_jax.papers import mario
  mario.diversity_reward("the cat sat on the mat")                  # 1.0 (no repeated n-gram)
  mario.quantile_bins(rewards, num_bins=5)                          # [N] int, 0 = best
  codes = mario.ControlCodes.from_tokenizer(tok)
  mario.control_prefix(codes.best(), codes)                         # K code token ids
  loss, m = mario.quark_loss(params, config, batch, ref_params, kl_coef=0.1)
  step = mario.make_quark_step(config, lora_config)                 # pure step(state, batch, key)
  out = mario.sample(key, params, config, prompt_ids, prompt_mask, codes_ids, max_new_tokens=48)
"""
from iclr24_jax.papers.mario import train
from iclr24_jax.papers.mario.control import (ControlCodes, DataPool, assign_bins, control_prefix,
                                             quantile_bins)
from iclr24_jax.papers.mario.quark import (encode_examples, encode_prompts, make_quark_step, make_sft_step,
                                           prompt_text, quark_loss, quark_step, sample, sft_step)
from iclr24_jax.papers.mario.rewards import (REWARD_NAMES, accuracy_reward, consistency_reward, diversity_reward,
                                             format_response, plausibility_prompts, plausibility_reward,
                                             repetition_rates, score_responses, split_response)

TITLE = "Tailoring Self-Rationalizers with Multi-Reward Distillation"
URL = "https://openreview.net/forum?id=t8eO0CiZJV"
CODE = "https://github.com/INK-USC/RationaleMultiRewardDistillation"
BIBTEX = """@inproceedings{ramnath2024tailoring,
  title     = {Tailoring Self-Rationalizers with Multi-Reward Distillation},
  author    = {Ramnath, Sahana and Joshi, Brihi and Hallinan, Skyler and Lu, Ximing and Li, Liunian Harold and
               Chan, Aaron and Hessel, Jack and Choi, Yejin and Ren, Xiang},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=t8eO0CiZJV}
}"""

__all__ = [
    "diversity_reward", "repetition_rates", "consistency_reward", "plausibility_reward", "plausibility_prompts",
    "accuracy_reward", "score_responses", "split_response", "format_response", "REWARD_NAMES", "quantile_bins",
    "ControlCodes", "control_prefix", "assign_bins", "DataPool", "quark_loss", "make_quark_step", "make_sft_step",
    "quark_step", "sft_step", "sample", "encode_examples", "encode_prompts", "prompt_text", "train", "TITLE",
    "URL", "CODE", "BIBTEX",
]
