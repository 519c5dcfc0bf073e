"""FPS: Diffusion Posterior Sampling for Linear Inverse Problem Solving -- A Filtering Perspective
(Dou & Song, ICLR 2024).

Paper: https://openreview.net/forum?id=tplXNcHZs1
Official code: https://github.com/ZehaoDou-official/FPS-SMC-2023 (guided_diffusion/gaussian_diffusion.py)

    from iclr24_jax.papers import fps
    op = fps.Inpainting(mask)                       # or SuperResolution(4, (16, 16, 1)), GaussianBlur(5, 1.5, shape),
                                                    #    MotionBlur(7, shape, angle=30.), Dense(A)
    y = op.measure(key, x0, sigma)                  # A x0 + sigma n
    particles = fps.sample(key, denoiser, schedule, op, y, sigma, num_particles=5, num_steps=100,
                           c=0.95, sampler='ddpm', resampling='multinomial')    # [5, *x_shape], pure, jittable
    # weights='telescoping': the corrected, asymptotically exact weights (beyond the paper; see smc.particle_filter)
    x_dps = fps.dps_sample(key, denoiser, schedule, op, y, num_samples=4, num_steps=100, zeta=1.0)
    post = fps.gmm_posterior(prior_gmm, op, y, sigma)    # exact posterior of a GMM prior (the ground truth)
"""
from iclr24_jax.papers.fps.baselines import ddim_sample, dps_sample, dps_step
from iclr24_jax.papers.fps.exact import (chain_moments, gaussian_posterior, gmm_posterior, kalman_reference,
                                        moments_over_sequences, noise_tracking_kalman, telescoping_reference)
from iclr24_jax.papers.fps.operators import (CircularBlur, Dense, GaussianBlur, Inpainting, LinearOperator, MotionBlur,
                                             SuperResolution, gaussian_kernel, motion_kernel)
from iclr24_jax.papers.fps.resampling import ess, multinomial, resample, stratified, systematic
from iclr24_jax.papers.fps.smc import (crate_ddim_transition, gaussian_condition, kernel, kernel_rates,
                                       measurement_sequence, particle_filter, sample)

TITLE = "Diffusion Posterior Sampling for Linear Inverse Problem Solving: A Filtering Perspective"
URL = "https://openreview.net/forum?id=tplXNcHZs1"
CODE = "https://github.com/ZehaoDou-official/FPS-SMC-2023"
BIBTEX = """@inproceedings{dou2024diffusion,
  title     = {Diffusion Posterior Sampling for Linear Inverse Problem Solving: A Filtering Perspective},
  author    = {Dou, Zehao and Song, Yang},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=tplXNcHZs1}
}"""

__all__ = [
    "sample", "particle_filter", "measurement_sequence", "gaussian_condition", "kernel", "kernel_rates",
    "crate_ddim_transition",
    "LinearOperator", "Inpainting", "SuperResolution", "GaussianBlur", "MotionBlur", "CircularBlur", "Dense",
    "gaussian_kernel", "motion_kernel",
    "resample", "multinomial", "systematic", "stratified", "ess",
    "dps_sample", "dps_step", "ddim_sample",
    "gmm_posterior", "gaussian_posterior", "kalman_reference", "moments_over_sequences", "noise_tracking_kalman",
    "chain_moments", "telescoping_reference",
    "TITLE", "URL", "CODE", "BIBTEX",
]
