"""Uni-O4: Unifying Online and Offline Deep Reinforcement Learning with Multi-Step On-Policy Optimization
(Lei, He, Lu, Hu, Gao, Xu; ICLR 2024).

Paper: https://arxiv.org/abs/2311.03351 (ICLR 2024)
Official code: https://github.com/Lei-Kun/Uni-O4

    from iclr24_jax.papers import unio4
    loss, m = unio4.ensemble_bc_loss(stacked_policy_params, {'obs': s, 'actions': a}, alpha=0.1)
    critics, hist = unio4.fit_value_functions(key, data, critic_config)          # V(s), Q(s, a)
    state, m = unio4.offline_ppo_step(state, obs, key, policy=pi, critics=critics, obs_stats=stats)
    score = unio4.offline_policy_evaluation(key, dynamics, policy_fn, q_fn, states, horizon)
    out = unio4.run_offline(config, dataset)                                       # all offline stages
    online = unio4.run_online(config.online, env, unio4.online_init(out, params, config))
"""
from iclr24_jax.papers.unio4.train import (FineTunePPO, evaluate_members, evaluation_program, get_env, improve,
                                           online_init, prepare_data, pretrain, run_offline, run_online,
                                           score_policies, two_learning_rate_optimizer)
from iclr24_jax.papers.unio4.bc import (bc_step, ensemble_bc_loss, fit_bc_ensemble, make_policy, members,
                                        pairwise_disagreement)
from iclr24_jax.papers.unio4.critics import (Critics, CriticState, critic_step, expectile_loss, fit_value_functions,
                                             q_loss, value_loss)
from iclr24_jax.papers.unio4.data import OfflineData, discounted_returns, frozen_stats, prepare, sample
from iclr24_jax.papers.unio4.dynamics import (TERMINATIONS, Dynamics, dynamics_loss, termination_for_env,
                                              train_dynamics)
from iclr24_jax.papers.unio4.improvement import (advantage_weights, asymmetric_clipped_objective, normalize_advantage,
                                                 offline_ppo_loss, offline_ppo_step, paired_ope_difference,
                                                 policy_improvement_loss, replace_if_better, replace_if_paired_better,
                                                 select_policy)
from iclr24_jax.papers.unio4.model import (DynamicsMember, GaussianPolicy, QNetwork, ensemble_size, init_ensemble,
                                           policy_from_params, stack_trees, unstack_tree)
from iclr24_jax.papers.unio4.ope import offline_policy_evaluation, ope_per_state

TITLE = "Uni-O4: Unifying Online and Offline Deep Reinforcement Learning with Multi-Step On-Policy Optimization"
URL = "https://arxiv.org/abs/2311.03351"
CODE = "https://github.com/Lei-Kun/Uni-O4"
BIBTEX = """@inproceedings{lei2024unio4,
  title     = {Uni-O4: Unifying Online and Offline Deep Reinforcement Learning with Multi-Step On-Policy
               Optimization},
  author    = {Lei, Kun and He, Zhengmao and Lu, Chenhao and Hu, Kaizhe and Gao, Yang and Xu, Huazhe},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://arxiv.org/abs/2311.03351}
}"""

__all__ = [
    # binding API
    "ensemble_bc_loss", "fit_value_functions", "offline_ppo_step", "offline_policy_evaluation", "run_offline",
    "run_online",
    # pieces
    "GaussianPolicy", "QNetwork", "DynamicsMember", "init_ensemble", "stack_trees", "unstack_tree", "ensemble_size",
    "policy_from_params", "OfflineData", "prepare", "sample", "discounted_returns", "frozen_stats", "Critics",
    "CriticState", "critic_step", "value_loss", "q_loss", "expectile_loss", "bc_step", "fit_bc_ensemble",
    "make_policy", "members", "pairwise_disagreement", "Dynamics", "dynamics_loss", "train_dynamics", "TERMINATIONS",
    "termination_for_env", "normalize_advantage", "advantage_weights", "asymmetric_clipped_objective",
    "policy_improvement_loss", "offline_ppo_loss", "replace_if_better", "select_policy", "pretrain", "improve",
    "prepare_data", "online_init", "FineTunePPO", "two_learning_rate_optimizer", "evaluation_program",
    "evaluate_members", "get_env", "ope_per_state", "paired_ope_difference", "replace_if_paired_better",
    "score_policies", "TITLE", "URL", "CODE", "BIBTEX",
]
