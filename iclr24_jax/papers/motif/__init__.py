"""Motif: Intrinsic Motivation from Artificial Intelligence Feedback (Klissarov, D'Oro, Sodhani, Raileanu,
Bacon, Vincent, Zhang, Henaff; ICLR 2024).

Paper: https://arxiv.org/abs/2310.00166   Official code: https://github.com/facebookresearch/motif

    from iclr24_jax.papers import motif
    prompt = motif.annotation_prompt("You kill the newt!", "It's a wall.", "defaultgoal")
    motif.parse_preference('... ("best_description": 1)')          # -> 0 (first), 1, 2 (none) or None
    loss, m = motif.preference_loss(params, {'message_1': m1, 'message_2': m2, 'label': y})
    mu, sigma, quantiles = motif.fit_normalisation(rewards)
    r_int = motif.intrinsic_reward(r, mu, sigma, eps, counts, beta=3.0)
    r = motif.combine_rewards(r_ext, r_int, alpha_ext=0.1, alpha_int=0.1)
    hook = motif.MotifRewardHook(reward_fn, mu, sigma, eps, num_envs)  # rl.ppo_host.HostPPO(reward_hook=hook)
"""
from iclr24_jax.papers.motif.annotation import (ANSWER_PREFIX, GOALS, RETRY_PROMPT, AnnotationCache, GenerateJudge,
                                                LogprobJudge, OracleJudge, annotate_pairs, annotation_prompt,
                                                label_from_margin, parse_preference)
from iclr24_jax.papers.motif.intrinsic import (QUANTILE_LEVELS, EpisodeMessageCounter, MotifRewardHook,
                                               combine_rewards, fit_normalisation, intrinsic_reward, threshold)
from iclr24_jax.papers.motif.train import (fit_reward, make_toy_train, oracle_values_fit, sample_pairs,
                                           split_by_pair, to_arrays, toy_reward_fn)
from iclr24_jax.papers.motif.reward_model import (MessageCNN, RewardModel, fit_reward_model, init_params,
                                                  label_targets, message_rewards, pair_accuracy, pair_rewards,
                                                  params_from_official, preference_loss)
from iclr24_jax.papers.motif.toy import CaptionedGridWorld, caption_and_count, caption_bytes, oracle_preference

TITLE = "Motif: Intrinsic Motivation from Artificial Intelligence Feedback"
URL = "https://arxiv.org/abs/2310.00166"
CODE = "https://github.com/facebookresearch/motif"
BIBTEX = """@inproceedings{klissarov2024motif,
  title     = {Motif: Intrinsic Motivation from Artificial Intelligence Feedback},
  author    = {Klissarov, Martin and D'Oro, Pierluca and Sodhani, Shagun and Raileanu, Roberta and
               Bacon, Pierre-Luc and Vincent, Pascal and Zhang, Amy and Henaff, Mikael},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://arxiv.org/abs/2310.00166}
}"""

__all__ = [
    # binding API
    "annotation_prompt", "parse_preference", "RewardModel", "preference_loss", "fit_normalisation",
    "intrinsic_reward", "combine_rewards",
    # annotation
    "AnnotationCache", "annotate_pairs", "LogprobJudge", "GenerateJudge", "OracleJudge", "label_from_margin",
    "GOALS", "RETRY_PROMPT", "ANSWER_PREFIX",
    # reward model
    "MessageCNN", "init_params", "pair_rewards", "label_targets", "fit_reward_model", "message_rewards",
    "pair_accuracy", "params_from_official",
    # intrinsic reward and hooks
    "threshold", "QUANTILE_LEVELS", "EpisodeMessageCounter", "MotifRewardHook", "toy_reward_fn",
    # pipeline and toy world
    "sample_pairs", "to_arrays", "split_by_pair", "fit_reward", "oracle_values_fit", "make_toy_train",
    "CaptionedGridWorld",
    "caption_and_count", "caption_bytes", "oracle_preference",
    "TITLE", "URL", "CODE", "BIBTEX",
]
