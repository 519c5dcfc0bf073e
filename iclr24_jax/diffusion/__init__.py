"""Diffusion core: noise schedules, forward process, DDPM / DDIM samplers, UNet and MLP denoisers, the
denoising loss, and an exact Gaussian-mixture denoiser. See README.md in this folder for the API.

Modules: schedules, process, samplers, gmm, metrics, unet, train (and experiment, the 'diffusion' check).
"""
from iclr24_jax.diffusion import gmm, metrics, process, samplers, schedules, train, unet
from iclr24_jax.diffusion.gmm import GaussianMixture, gmm_denoiser, make_gmm, ring_gmm
from iclr24_jax.diffusion.metrics import (component_frequencies, moment_errors, sliced_wasserstein,
                                          sliced_wasserstein_vs_data)
from iclr24_jax.diffusion.process import (convert, eps_to_x0, posterior_mean_var, predict_eps, predict_x0,
                                          q_mean_var, q_sample, target_for, to_v, v_to_eps, v_to_x0, x0_to_eps)
from iclr24_jax.diffusion.samplers import (Transition, classifier_free_guidance, ddim_transition, ddpm_transition,
                                           sample, sampler_step, sampling_grid, split_sampler_keys)
from iclr24_jax.diffusion.schedules import (ContinuousSchedule, DiscreteSchedule, cosine_beta_schedule, discretize,
                                            linear_beta_schedule, make_schedule, resolution_shift, shift_schedule,
                                            squaredcos_cap_v2)
from iclr24_jax.diffusion.train import (diffusion_loss, init, loss_weight, make_denoiser,
                                        make_train_step)
from iclr24_jax.diffusion.unet import MLPDenoiser, UNet, create_model, timestep_embedding, unet_flops

__all__ = [
    "gmm", "metrics", "process", "samplers", "schedules", "train", "unet",
    "GaussianMixture", "gmm_denoiser", "make_gmm", "ring_gmm",
    "component_frequencies", "moment_errors", "sliced_wasserstein", "sliced_wasserstein_vs_data",
    "convert", "eps_to_x0", "posterior_mean_var", "predict_eps", "predict_x0", "q_mean_var", "q_sample",
    "target_for", "to_v", "v_to_eps", "v_to_x0", "x0_to_eps",
    "Transition", "classifier_free_guidance", "ddim_transition", "ddpm_transition", "sample", "sampler_step",
    "sampling_grid", "split_sampler_keys",
    "ContinuousSchedule", "DiscreteSchedule", "cosine_beta_schedule", "discretize", "linear_beta_schedule",
    "make_schedule", "resolution_shift", "shift_schedule", "squaredcos_cap_v2",
    "diffusion_loss", "init", "loss_weight", "make_denoiser", "make_train_step",
    "MLPDenoiser", "UNet", "create_model", "timestep_embedding", "unet_flops",
]

# Matryoshka diffusion (mdm): per-level transitions and the joint multi-resolution sampler.
from iclr24_jax.diffusion.samplers import level_transitions, sample_levels  # noqa: E402

__all__ += ["level_transitions", "sample_levels"]
