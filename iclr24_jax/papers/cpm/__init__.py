"""CPM: Compositional Preference Models for Aligning LMs (Go, Korbak, Kruszewski, Rozen, Dymetman; ICLR 2024).

Paper: https://arxiv.org/abs/2310.13011 (ICLR 2024)
Official code: https://github.com/dongyoung-go/CPM

A CPM scores 13 interpretable features of a reply with a prompted LM (1-10 each), adds the reply's length,
standardises the features (mean / std pooled over both replies of the pairs) and fits a logistic regression
on feature differences: R(y) = sum_i w_i (f_i(y) - mu_i) / sigma_i and P(A > B) = sigmoid(R(A) - R(B)).

    from iclr24_jax.papers import cpm
    cpm.FEATURES                                        # the 13 feature names
    cpm.feature_prompt('helpfulness', history, reply)   # the prompt for one feature
    cpm.parse_score('7')                                # -> 7 (None when unparseable)
    model = cpm.fit(features_a, features_b, labels, penalty='l1', C=1.0)   # [N, F], [N, F], [N]
    cpm.reward(model, features)                         # [M]
    cpm.preference_prob(model, features_a, features_b)  # [N]
    cpm.best_of_n(rewards_pick, rewards_eval)           # [P, n], [P, n] -> [P]
"""
from iclr24_jax.papers.cpm.data import history_messages, load_pairs, make_synthetic
from iclr24_jax.papers.cpm.features import (ALL_FEATURES, FEATURE_TEXTS, FEATURES, LENGTH_FEATURE, SCORES,
                                            SUFFIX_TEMPLATES, chat_parts, expected_score, feature_matrix,
                                            feature_prompt, length_feature, parse_score, prompt_parts,
                                            split_dialogue)
from iclr24_jax.papers.cpm.model import (OFFICIAL_CS, PENALTIES, Model, accuracy, best_of_n, best_of_n_curve,
                                         complete_pairs, cross_validate, fit, fit_differences, logistic_objective,
                                         pair_correct, pair_differences, preference_prob, reward,
                                         single_feature_correct, standardization)
from iclr24_jax.papers.cpm.pm import fit_pm
from iclr24_jax.papers.cpm.scoring import (FakeScorer, ScoreCache, SmolLMScorer, score_features,
                                           suffix_digit_logprobs)

TITLE = "Compositional Preference Models for Aligning LMs"
URL = "https://arxiv.org/abs/2310.13011"
ARXIV = "https://arxiv.org/abs/2310.13011"
CODE = "https://github.com/dongyoung-go/CPM"
BIBTEX = """@inproceedings{go2024compositional,
  title     = {Compositional Preference Models for Aligning {LM}s},
  author    = {Go, Dongyoung and Korbak, Tomasz and Kruszewski, Germ{\\'a}n and Rozen, Jos and Dymetman, Marc},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://arxiv.org/abs/2310.13011}
}"""

__all__ = [
    # binding API
    "FEATURES", "feature_prompt", "parse_score", "fit", "Model", "reward", "preference_prob", "best_of_n",
    # features and prompts
    "ALL_FEATURES", "FEATURE_TEXTS", "LENGTH_FEATURE", "SCORES", "SUFFIX_TEMPLATES", "prompt_parts", "chat_parts",
    "expected_score", "length_feature", "feature_matrix", "split_dialogue",
    # fitting
    "standardization", "pair_differences", "logistic_objective", "fit_differences", "cross_validate",
    "OFFICIAL_CS", "PENALTIES", "accuracy", "pair_correct", "complete_pairs", "best_of_n_curve",
    "single_feature_correct", "fit_pm",
    # scoring with an LM
    "SmolLMScorer", "FakeScorer", "ScoreCache", "score_features", "suffix_digit_logprobs",
    # data
    "load_pairs", "history_messages", "make_synthetic",
    "TITLE", "URL", "ARXIV", "CODE", "BIBTEX",
]
