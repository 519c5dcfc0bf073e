"""LDCQ: Reasoning with Latent Diffusion in Offline Reinforcement Learning (Venkatraman, Khaitan, Akella, Dolan,
Schneider, Berseth; ICLR 2024).

Paper: https://arxiv.org/abs/2309.06599 (ICLR 2024)
Official code: https://github.com/ldcq/ldcq

    from iclr24_jax.papers import ldcq
    loss, m = ldcq.vae_loss(vae_params, vae, {'states': s, 'actions': a, 'next_state': sH}, key)   # beta-VAE
    loss, aux = ldcq.latent_diffusion_loss(den_params, denoiser, schedule, s0, z, key)           # x0, min-SNR 5
    z = ldcq.sample_latents(key, params, states, n)          # [B, n, Z] DDPM samples of p(z | s)
    y = ldcq.q_target(q_net, target_params, r, sH, zH, done, discount=gamma ** H)['targets']
    q_state, m = ldcq.q_train_step(q_state, None, key, cfg=ldcq.QConfig(q_net, discount=gamma ** H))
    z = ldcq.act(key, params, state, num_samples)            # argmax_z Q over prior samples
    z = ldcq.act_maze(key, params, state, num_samples)       # the official maze2d two-stage planner
"""
from iclr24_jax.papers.ldcq.train import (INITIAL_PRIORITY, PLANNERS, PRIORS, SCORES, LDCQParams, LDCQSpec,
                                          QConfig, act, act_maze, bc_init, bc_step, diffusion_init, diffusion_step,
                                          encode, evaluate_bc, evaluate_policy, evaluate_random, evaluate_skills,
                                          low_level_action, make_buffer, q_dataset, q_init, q_train_step, q_values,
                                          sample_latents, stage_keys, train_bc, train_diffusion, train_q, train_steps,
                                          train_vae, vae_init, vae_step)
from iclr24_jax.papers.ldcq.data import make_segments, relabel_maze_rewards, segment_starts
from iclr24_jax.papers.ldcq.losses import (bc_loss, gaussian_kl, gaussian_log_prob, latent_diffusion_loss, q_target,
                                           vae_loss)
from iclr24_jax.papers.ldcq.model import BCPolicy, QNetwork, SkillVAE, twin_q_apply, twin_q_init

TITLE = "Reasoning with Latent Diffusion in Offline Reinforcement Learning"
URL = "https://arxiv.org/abs/2309.06599"
CODE = "https://github.com/ldcq/ldcq"
BIBTEX = """@inproceedings{venkatraman2024ldcq,
  title     = {Reasoning with Latent Diffusion in Offline Reinforcement Learning},
  author    = {Venkatraman, Siddarth and Khaitan, Shivesh and Akella, Ravi Tej and Dolan, John and
               Schneider, Jeff and Berseth, Glen},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://arxiv.org/abs/2309.06599}
}"""

__all__ = [
    # binding API
    "SkillVAE", "vae_loss", "latent_diffusion_loss", "sample_latents", "q_target", "q_train_step", "act",
    "act_maze", "PLANNERS", "SCORES", "INITIAL_PRIORITY",
    # pieces
    "QNetwork", "BCPolicy", "twin_q_init", "twin_q_apply", "LDCQSpec", "LDCQParams", "QConfig", "PRIORS", "q_init",
    "q_values", "low_level_action", "encode", "train_vae", "train_diffusion", "train_bc", "train_q", "q_dataset",
    "make_buffer", "vae_init", "vae_step", "diffusion_init", "diffusion_step", "bc_init", "bc_step", "stage_keys",
    "train_steps", "evaluate_skills", "evaluate_bc", "evaluate_policy", "evaluate_random", "bc_loss",
    "gaussian_log_prob", "gaussian_kl",
    "make_segments", "segment_starts", "relabel_maze_rewards", "TITLE", "URL", "CODE", "BIBTEX",
]
