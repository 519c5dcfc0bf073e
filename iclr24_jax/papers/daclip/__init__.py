"""DA-CLIP: Controlling Vision-Language Models for Multi-Task Image Restoration (Luo et al., ICLR 2024).

Paper: https://openreview.net/forum?id=t3vnnLeajU  (arXiv: https://arxiv.org/abs/2310.01018)
Official code: https://github.com/Algolzw/daclip-uir

    from iclr24_jax.papers import daclip
    model = daclip.daclip_from_clip(clip_model)                      # frozen ViT + controller copy
    params = daclip.init_daclip_params(model, clip_params, (32, 32, 1))
    e_c, e_d = model.apply({'params': params}, lq_images)           # content / degradation embeddings
    loss, m = daclip.controller_loss(params, model, batch)          # InfoNCE(e_c, caption) + InfoNCE(e_d, name)
    sde = daclip.irsde_schedule(T=100, lambda_=50 / 255)
    x_t = daclip.irsde_forward_sample(key, x0, mu, t, sde)          # closed-form forward marginal
    target = daclip.optimal_reverse_step(x_t, x0, mu, t, sde)       # x*_{t-1}, the bridge posterior mean
    restored = daclip.restore(key, unet_params, lq, model=unet, schedule=sde, e_c=e_c, e_d=e_d)
"""
from iclr24_jax.papers.daclip.degradations import (DEGRADATIONS, degradation_captions, degrade, degrade_one,
                                                   load_clean_digits, make_suite)
from iclr24_jax.papers.daclip.irsde import (IRSDESchedule, forward_euler_step, irsde_forward_sample, irsde_mean,
                                            irsde_schedule, irsde_std, matching_loss, matching_loss_per_example,
                                            optimal_reverse_std, optimal_reverse_step, reverse_posterior_step,
                                            reverse_sample, reverse_sample_mean, reverse_sde_mean, reverse_sde_step,
                                            score_from_noise, x0_from_noise)
from iclr24_jax.papers.daclip.model import (DaClip, controller_loss, create_restorer, daclip_from_clip,
                                            degradation_logits, heldout_matching_loss, init_daclip_params,
                                            make_controller_optimizer, make_controller_train_step,
                                            make_restoration_train_step, predict_noise, restoration_loss, restore,
                                            trainable_mask)

TITLE = "Controlling Vision-Language Models for Multi-Task Image Restoration"
URL = "https://openreview.net/forum?id=t3vnnLeajU"
CODE = "https://github.com/Algolzw/daclip-uir"
BIBTEX = """@inproceedings{luo2024controlling,
  title     = {Controlling Vision-Language Models for Multi-Task Image Restoration},
  author    = {Luo, Ziwei and Gustafsson, Fredrik K. and Zhao, Zheng and Sj{\\"o}lund, Jens and Sch{\\"o}n, Thomas B.},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=t3vnnLeajU}
}"""

__all__ = [
    "DaClip", "daclip_from_clip", "init_daclip_params", "controller_loss", "make_controller_optimizer",
    "make_controller_train_step", "trainable_mask", "degradation_logits",
    "IRSDESchedule", "irsde_schedule", "irsde_mean", "irsde_std", "irsde_forward_sample", "forward_euler_step",
    "optimal_reverse_step", "optimal_reverse_std", "score_from_noise", "x0_from_noise", "reverse_sde_mean",
    "reverse_sde_step", "reverse_posterior_step", "matching_loss", "matching_loss_per_example", "reverse_sample",
    "reverse_sample_mean", "restore", "create_restorer", "predict_noise", "restoration_loss", "heldout_matching_loss", "make_restoration_train_step",
    "DEGRADATIONS", "degrade", "degrade_one", "make_suite", "degradation_captions", "load_clean_digits",
    "TITLE", "URL", "CODE", "BIBTEX",
]
