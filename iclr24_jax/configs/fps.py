"""FPS: Diffusion Posterior Sampling for Linear Inverse Problem Solving -- A Filtering Perspective (Dou & Song,
ICLR 2024). Paper: https://openreview.net/forum?id=tplXNcHZs1  Code: https://github.com/ZehaoDou-official/FPS-SMC-2023

Run:  python -m experiments.main --config=configs/fps.py:tiny --workdir=runs/fps_tiny
      python -m experiments.main --config=configs/fps.py --workdir=runs/fps            # the exactness study
      python -m experiments.main --config=configs/fps.py:images --workdir=runs/fps_img  # digits inverse problems
Variants (after the colon): '' (exactness study with the exact GMM denoiser, the default), 'tiny' (seconds),
'tiny_images' (the image path in seconds),
'images' (inpainting, 4x super-resolution, Gaussian and motion deblurring on digits with a trained diffusion
model), one image task alone: 'inpainting', 'super_resolution', 'gaussian_blur', 'motion_blur', and
'official' (the image tasks at the official 1000 steps; the default image sampler is already the official
c-rate DDIM kernel with 5 particles, at 250 steps, and DPS runs the same steps), 'paper' (the official FFHQ
256 x 256 run: the ADM UNet of configs/model_config.yaml, 4x super-resolution, 5 particles, 1000 steps; compiled
ahead of time by `iclr24 scale --only fps`).
"""
import ml_collections

from iclr24_jax.configs import variants

TASKS = ("inpainting", "super_resolution", "gaussian_blur", "motion_blur")
VARIANTS = ("", "tiny", "tiny_images", "images", "official", "paper") + TASKS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The FPS config: the exactness study with the exact GMM denoiser unless `arg` selects the image tasks.

  Args:
    arg: '' (exactness study), 'tiny', 'tiny_images', 'images' (all four digit inverse problems), one task
      ('inpainting', 'super_resolution', 'gaussian_blur', 'motion_blur'), 'official' (image tasks at
      1000 steps) or 'paper' (the official FFHQ 256 x 256 sizes); None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "fps"
  c.seed = 0
  c.task = "exactness"            # 'exactness' | 'images'
  # The image tasks' sampler: the official one (c-rate DDIM kernel, c = 0.95, 5 particles, multinomial resampling
  # every step, clip x0_hat to [-1, 1]) but 250 steps instead of 1000 (the CPU budget of the reproduction; DPS runs
  # the same number). The exactness study runs both kernels at its own exactness.num_steps.
  c.fps = ml_collections.ConfigDict(dict(num_particles=5, num_steps=250, c=0.95, sampler="ddim",
                                         resampling="multinomial", ess_threshold=None, clip_x0=1.0))
  c.num_steps = 250               # sampler steps of the image tasks (the official code runs 1000)
  # Exactness study: exact GMM denoiser, exact GMM posterior (see papers/fps/study_exactness.py exactness_study).
  c.exactness = ml_collections.ConfigDict(dict(
      # The c sweep (rates) runs in the Gaussian M = infinity study (exact); on the GMMs only c = 0.95
      # (sweep_max_particles = 0), the DDIM kernel up to M = 50: the reproduction stays within its time.
      dims=(2, 8), particles=(1, 5, 50, 500), full_grid_max_particles=50, sweep_max_particles=0,
      ddim_max_particles=50, rates=(0.5, 0.95, 1.0), weights=("fps", "telescoping"), num_seeds=4,
      samplers=("ddpm", "ddim"), sigma=0.25, sigma_small=0.05, num_runs=(512, 256), num_steps=100,
      dps_zetas=(0.03, 0.1, 0.3, 1.0, 3.0),
      ring_y=1.5, obs_dim_8d=2, gaussian_sigmas=(0.05, 0.25, 1.0), gaussian_steps=(100, 1000),
      gaussian_sequences=100,
      # CPU: programs with at most this many particle-steps compile at XLA optimisation level 0 (compile 2-4x
      # faster, run 2-3x slower: a win when compile time dominates). 0 turns it off.
      fast_compile_below=2.5e6))
  # Image tasks (digits upsampled to 16 x 16, in [-1, 1]).
  c.images = ml_collections.ConfigDict(dict(
      # num_val_images: validation images (disjoint from the num_images test images) DPS's step size is chosen on.
      tasks=TASKS, num_images=12, num_val_images=8, samples_per_image=4, sigma=0.05, box_size=8, sr_factor=4, blur_kernel=5,
      blur_std=1.0, motion_kernel=5, motion_angle=45.0, motion_length=5.0, dps_zetas=(0.3, 1.0, 3.0, 10.0),
      methods=("fps", "fps_ddpm", "fps_tele", "dps", "ddim", "pinv"),   # add "fps_m1" for the particle-free FPS
      telescoping_tasks=("inpainting", "super_resolution")))   # where "fps_tele" (telescoping weights) runs
  # The diffusion prior of the image tasks (diffusion core MLP denoiser; see model.py), cached by config hash.
  c.data = ml_collections.ConfigDict(dict(name="digits", data_dir="", image_size=16))
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=512, num_blocks=3, time_embed_dim=128,
                                           time_scale=1.0, num_classes=0, dropout=0.0))
  c.schedule = ml_collections.ConfigDict(dict(name="linear", num_timesteps=1000, continuous=False, shift=0.0))
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=1e-3, schedule="cosine",
                                               warmup_steps=100, end_factor=0.05, grad_clip=1.0))
  c.train_steps = 2000
  c.batch_size = 128
  c.ema_decay = 0.995
  c.use_cache = True
  c.log_every = 100
  c.eval_every = 0
  c.checkpoint_every = 500         # steps of the prior's training (train_steps)
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))

  arg = variants.one(arg, VARIANTS, name="fps")
  if arg == "tiny":      # the exactness study in seconds: 2-D, one particle count, one c, DDPM only
    c.num_steps = 10
    c.fps.num_steps = 10
    c.exactness.update(dict(dims=(2,), particles=(4,), rates=(0.95,), samplers=("ddpm",), num_runs=(32,),
                            num_steps=10, dps_zetas=(0.3,), gaussian_sigmas=(0.25,), gaussian_steps=(10,),
                            gaussian_sequences=4))
  elif arg == "tiny_images":   # the image path in seconds: a 20-step prior, one task, FPS and the pseudo-inverse
    c.task = "images"
    c.num_steps = 5
    c.fps.num_steps = 5
    c.images.update(dict(tasks=("inpainting",), num_images=2, dps_zetas=(1.0,), methods=("fps", "pinv")))
    c.model.update(dict(hidden=32, num_blocks=1, time_embed_dim=16))
    c.train_steps = 20
    c.checkpoint_every = 10
    c.batch_size = 32
    c.log_every = 10
    c.optimizer.warmup_steps = 2
    c.use_cache = False
  elif arg in ("images", "official") + TASKS:
    c.task = "images"
    if arg in TASKS:
      c.images.tasks = (arg,)
    if arg == "official":   # the official sampler at its full 1000 steps (slow on CPU: about 4x 'images')
      c.fps.sampler = "ddim"
      c.fps.num_steps = 1000
      c.num_steps = 1000
      c.images.methods = ("fps", "dps", "pinv")
  elif arg == "paper":
    # The official run, ZehaoDou-official/FPS-SMC-2023@008e7f7: scripts/run_sampling.sh -> sample_condition.py
    # with configs/model_config.yaml, configs/diffusion_config.yaml and configs/<task>_config.yaml.
    c.task = "images"
    c.data = ml_collections.ConfigDict(dict(name="ffhq", data_dir="", image_size=256))  # model_config.yaml:5
    # DPS's FFHQ ADM (model_config.yaml:5-21): 128 channels, channel_mult '' = (1, 1, 2, 2, 4, 4) at 256
    # (guided_diffusion/unet.py:44-48), one res block per level, attention at 16 x 16 (level 4, 512 channels:
    # num_head_channels 64 = 8 heads, as in the 8 x 8 middle block), scale-shift norm, ResBlock up/down,
    # learn_sigma (6 output channels: eps and the variance interpolation), dropout 0; 93.6M parameters.
    c.model = ml_collections.ConfigDict(dict(
        name="unet", base_channels=128, channel_mults=(1, 1, 2, 2, 4, 4), num_res_blocks=1, attention_levels=(4,),
        num_heads=8, out_channels=6, scale_shift=True, resblock_updown=True, dropout=0.0, num_groups=32))
    # diffusion_config.yaml:1-9: linear betas over 1000 steps, epsilon prediction, clip_denoised, 1000 sampler steps.
    c.schedule = ml_collections.ConfigDict(dict(name="linear", num_timesteps=1000, continuous=False, shift=0.0))
    c.num_steps = 1000
    # sample_condition.py:37-38 (c_rate 0.95, particle_size 5), :86 (batch_size 1 per sampler call); the c-rate
    # DDIM kernel (gaussian_diffusion.py DDIM.p_sample) with multinomial resampling at every step.
    c.fps = ml_collections.ConfigDict(dict(num_particles=5, num_steps=1000, c=0.95, sampler="ddim",
                                           resampling="multinomial", ess_threshold=None, clip_x0=1.0))
    # super_resolution_config.yaml:12-19: 4x average-pooling super-resolution of [3, 256, 256], noise sigma 0.05.
    c.images.update(dict(tasks=("super_resolution",), sr_factor=4, sigma=0.05, methods=("fps",)))
    c.use_cache = False
    # What experiments.scale compiles: FPS on `batch_size` images at once, one image (its 5 particles, 1000
    # steps) per device; the official script runs one image per sampler call on one GPU.
    c.scale = ml_collections.ConfigDict(dict(
        batch_size=8, task="super_resolution",
        paper_hardware="one GPU per sampler call (scripts/run_sampling.sh:13 --gpu, sample_condition.py:35; model "
                       "not stated)",
        paper_time="not stated in the official code",
        source="ZehaoDou-official/FPS-SMC-2023@008e7f7 configs/model_config.yaml:5-21, "
               "configs/diffusion_config.yaml:1-9, configs/super_resolution_config.yaml:12-19, "
               "sample_condition.py:37-38,86, guided_diffusion/unet.py:44-48"))
  return c
