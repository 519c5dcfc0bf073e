"""The diffusion family check: a class-conditional UNet DDPM on scikit-learn digits, plus exact-GMM sampler checks.

Papers: DDPM (Ho et al. 2020, https://arxiv.org/abs/2006.11239), DDIM (Song et al. 2021,
https://arxiv.org/abs/2010.02502), classifier-free guidance (Ho & Salimans 2022, https://arxiv.org/abs/2207.12598).

Run:  python -m experiments.main --config=configs/diffusion.py:tiny --workdir=runs/diffusion
Variants (after the colon): '' (8x8 digits, the default), 'tiny', 'x16' (digits upsampled to 16x16),
'v_cosine' (v-prediction, cosine schedule, min-SNR weighting), 'continuous' (continuous-time cosine schedule
with v-prediction), 'unconditional'.
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "tiny", "x16", "v_cosine", "continuous", "unconditional")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The diffusion family check: a class-conditional UNet DDPM on 8x8 digits (linear schedule, DDIM sampling).

  Args:
    arg: '' (the default), 'tiny', 'x16' (digits upsampled to 16x16), 'v_cosine' (v-prediction, cosine
      schedule, min-SNR weighting), 'continuous' (continuous-time cosine schedule, v-prediction) or
      'unconditional'; None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "diffusion"
  c.seed = 0
  c.data = ml_collections.ConfigDict(dict(name="digits", data_dir="", image_size=8))
  c.model = ml_collections.ConfigDict(dict(
      name="unet", base_channels=32, channel_mults=(1, 2), num_res_blocks=1, attention_levels=(1,),
      mid_attention=True, num_heads=4, num_classes=10, num_groups=8, dropout=0.0, time_scale=1.0))
  # DDPM's linear schedule over T = 1000 steps (Ho et al. 2020, Sec. 4).
  c.schedule = ml_collections.ConfigDict(dict(name="linear", num_timesteps=1000, continuous=False, shift=0.0))
  c.diffusion = ml_collections.ConfigDict(dict(prediction="eps", weighting="none", min_snr_gamma=5.0,
                                               cond_drop_prob=0.1, ema_decay=0.995))
  c.sampler = ml_collections.ConfigDict(dict(method="ddim", num_steps=50, eta=0.0, guidance_scale=2.0,
                                             num_samples=200, clip_x0=1.0))
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=2e-3, schedule="cosine",
                                               warmup_steps=100, end_factor=0.05, grad_clip=1.0))
  c.num_steps = 1200
  c.batch_size = 128
  # The digits classifier that judges the samples (vision.classify on the 8x8 digits).
  c.classifier = ml_collections.ConfigDict(dict(num_steps=400, batch_size=64, features=(16, 32), dense=64,
                                                learning_rate=2e-3))
  c.log_every = 50
  c.eval_every = 0
  c.checkpoint_every = 300
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  arg = variants.one(arg, VARIANTS, name="diffusion")
  if arg == "tiny":
    c.num_steps = 20
    c.batch_size = 32
    c.log_every = 5
    c.checkpoint_every = 10
    c.optimizer.warmup_steps = 5
    c.model.base_channels = 8
    c.model.num_heads = 2
    c.model.channel_mults = (1,)    # one level, no attention: a short CPU compile
    c.model.attention_levels = ()
    c.model.mid_attention = False
    c.sampler.num_steps = 5
    c.sampler.num_samples = 20
    c.classifier.num_steps = 20
    c.classifier.features = (8,)
    c.classifier.dense = 16
  elif arg == "x16":
    c.data.image_size = 16
  elif arg == "v_cosine":
    c.schedule.name = "cosine"
    c.diffusion.prediction = "v"
    c.diffusion.weighting = "min_snr"
  elif arg == "continuous":
    c.schedule.name = "cosine"
    c.schedule.continuous = True
    c.model.time_scale = 1000.0
    c.diffusion.prediction = "v"
  elif arg == "unconditional":
    c.model.num_classes = 0
    c.diffusion.cond_drop_prob = 0.0
    c.sampler.guidance_scale = None
  return c
