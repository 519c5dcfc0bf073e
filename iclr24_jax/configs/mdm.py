"""MDM: Matryoshka Diffusion Models (Gu et al., ICLR 2024).

Paper: https://arxiv.org/abs/2310.15111   Official code: https://github.com/apple/ml-mdm

Run:  python -m experiments.main --config=configs/mdm.py:tiny --workdir=runs/mdm_tiny
      python -m experiments.main --config=configs/mdm.py --workdir=runs/mdm            # progressive, MNIST-5k 32 -> 8
      python -m experiments.main --config=configs/mdm.py:nested --workdir=runs/mdm_nested
      python -m experiments.main --config=configs/mdm.py:single --workdir=runs/mdm_single
Variants (comma-separated): 'tiny' (scikit-learn digits 16 -> 8, seconds on CPU); the arm: 'progressive'
(default: train the low-resolution UNet, load it as the inner network, train the NestedUNet), 'nested' (the
NestedUNet from scratch), 'single' (one UNet at the high resolution only); 'p2' (schedule shift power 2);
'one_seed' (the reproduction at seed 0 without the sample curve: the main job's miniature); 'paper'
(ImageNet 256 x 256 with the official 256 NestedUNet, compiled ahead of time by
`python -m experiments.scale --only mdm`).

Official run settings (configs/models/cc12m_256x256.yaml) kept here: squaredcos_cap_v2 ('DEEPFLOYD') with 1000
steps, v-prediction with an eps-space loss, loss on every level with weight 1, shift power 1, outer UNet without
middle blocks, zero-initialised adapters, CLIP thresholding at sampling. Sizes, steps and learning rate are
scaled to a CPU (see iclr24_jax/papers/mdm/README.md).
"""
import ml_collections

from iclr24_jax.configs import variants

ARMS = ("progressive", "nested", "single")
VARIANTS = ("tiny", "p2", "paper", "one_seed") + ARMS

_BLOCK = dict(num_res_blocks=1, attention_levels=(), num_groups=8, scale_shift=True, mid_attention=False)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The MDM config: the progressive arm on MNIST-5k, levels 32 -> 8, unless `arg` picks another arm or size.

  Args:
    arg: comma-separated: 'tiny' (digits 16 -> 8, seconds), 'p2' (schedule shift power 2), 'one_seed' (the
      reproduction at seed 0, no sample curve), 'paper' (the
      official 256 x 256 sizes on ImageNet) and at most one arm ('progressive', 'nested', 'single'); None or ''
      gives the default.

  Returns:
    ml_collections.ConfigDict (c.arm holds the arm).

  Raises:
    ValueError: unknown variant or more than one arm.
  """
  parts = variants.parse(arg, VARIANTS, name="mdm", exclusive=(ARMS,))
  arms = [p for p in parts if p in ARMS]
  c = ml_collections.ConfigDict()
  c.paper = "mdm"
  c.seed = 0
  c.arm = arms[0] if arms else "progressive"
  # MNIST-5k (4,000 train / 500 val / 500 test) zero-padded 28 -> 32, in [-1, 1]; levels 32 -> 8 (factor 4).
  c.data = ml_collections.ConfigDict(dict(name="mnist5k", data_dir="", image_size=32))
  # Levels high -> low. The outer UNet's bottleneck (32 / 2^2 = 8) is the inner level's resolution.
  c.model = ml_collections.ConfigDict(dict(
      levels=[dict(base_channels=8, channel_mults=(1, 2, 2), **_BLOCK),       # 32x32 outer (no middle blocks)
              dict(base_channels=16, channel_mults=(1, 2), **_BLOCK)],        # 8x8 inner (with middle blocks)
      # The single-resolution baseline: the outer's levels followed by the inner's, one UNet at 32x32.
      single=dict(base_channels=8, channel_mults=(1, 2, 2, 4), **_BLOCK),
      num_classes=10, skip_inner_input=False))
  c.diffusion = ml_collections.ConfigDict(dict(
      schedule="squaredcos_cap_v2", num_timesteps=1000, power=1.0, prediction="v", loss_target="eps",
      level_weights=None, mixed_ratio=None, cond_drop_prob=0.1))
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=2e-3, schedule="constant",
                                               warmup_steps=20, grad_clip=1.0))
  c.batch_size = 16
  c.num_steps = 600               # the nested / single model's steps (run())
  c.inner_steps = 600             # progressive: the low-resolution UNet's steps first
  c.log_every = 50
  c.eval_every = 0
  c.checkpoint_every = 150
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.sampler = ml_collections.ConfigDict(dict(num_samples=100, num_steps=25, method="ddim", eta=0.0,
                                             guidance_scale=2.0, clip_x0=1.0))
  c.judge = ml_collections.ConfigDict(dict(enabled=True, num_steps=300, batch_size=64, features=(16, 32), dense=64,
                                           learning_rate=2e-3))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  c.mesh_devices = 0               # 0: all devices; n: the first n
  c.fast_compile = False           # True: compile run()'s evaluation programs at XLA backend level 0
  # The reproduction (papers/mdm/study.py reproduce, budget_plan): three arms, 3 seeds, equal high-res steps; the
  # progressive arm's 8x8 pre-training (inner_fraction of the nested arm's high-res FLOPs) comes on top.
  # curve_steps: the single arm of the first seed trains on to these steps, its samples judged each time
  # (curve_samples of them): the budget at which samples become digits (~90 CPU-s per 1,000 steps on 2 cores;
  # the whole curve ~530 CPU-s).
  c.repro = ml_collections.ConfigDict(dict(
      seeds=(0, 1, 2), high_res_steps=150, inner_fraction=0.25, checkpoints=3, eval_examples=128,
      samples_per_seed=30, sample_steps=16, curve_steps=(300, 600, 1000, 2000, 3000, 4500, 6000),
      curve_samples=100))

  if "p2" in parts:
    c.diffusion.power = 2.0
  if "tiny" in parts:
    # scikit-learn digits 8x8 upsampled to 16x16 (no detail above 8x8: a plumbing check, not a study).
    c.data = ml_collections.ConfigDict(dict(name="digits", data_dir="", image_size=16))
    tiny = dict(num_res_blocks=1, attention_levels=(), num_groups=4, scale_shift=True, mid_attention=False)
    c.model.levels = [dict(base_channels=4, channel_mults=(1, 2), **tiny),
                      dict(base_channels=8, channel_mults=(1,), **tiny)]
    c.model.single = dict(base_channels=4, channel_mults=(1, 2, 2), **tiny)
    c.diffusion.num_timesteps = 100
    c.batch_size = 8
    c.num_steps = 3
    c.inner_steps = 3
    c.log_every = 1
    c.checkpoint_every = 2
    c.sampler.num_samples = 10
    c.sampler.num_steps = 3
    c.judge.enabled = False
    c.mesh_devices = 1     # one device: the smoke run is compile-bound (a sharded compile costs more)
    c.fast_compile = True  # held-out loss and sampler compiled at XLA backend level 0
    c.judge.num_steps = 20
    c.repro = ml_collections.ConfigDict(dict(
        seeds=(0, 1, 2), high_res_steps=6, inner_fraction=0.25, checkpoints=2, eval_examples=16,
        samples_per_seed=10, sample_steps=3, curve_steps=(), curve_samples=10))
  if "one_seed" in parts:
    # The main job's miniature (study.reproduce): seed 0 only, no sample curve; the 3-seed study with the curve
    # runs by name (mdm_seeds) and is tabled from its recorded rows.
    c.repro.seeds = (0,)
    c.repro.curve_steps = ()
  if "paper" in parts:
    # The official 256 x 256 run, apple/ml-mdm@de8cde2: ml-mdm-matryoshka/configs/models/cc12m_256x256.yaml (the
    # paper's ImageNet 256 model is the same NestedUNet, class- instead of text-conditioned; paper: 8 A100s).
    c.data = ml_collections.ConfigDict(dict(name="imagenet", data_dir="", image_size=256))
    attn = dict(num_groups=32, scale_shift=True, num_heads=8, time_embed_dim=1024)
    c.model = ml_collections.ConfigDict(dict(
        levels=[
            # outer 256 -> 128 -> 64 (yaml:35-79): resolution_channels [64, 128, 256], num_resnets [2, 2, 1], no
            # attention, skip_mid_blocks, temporal_dim 1024.
            dict(base_channels=64, channel_mults=(1, 2, 4), num_res_blocks=(2, 2, 1), attention_levels=(),
                 mid_attention=False, **attn),
            # inner 64 -> 32 -> 16 (yaml:41-60): [256, 512, 768], num_resnets [2, 2, 2], attention at levels 1 and 2
            # with [0, 1, 5] layers, attention FFN, 8 heads (unet.py SelfAttention default), middle blocks.
            dict(base_channels=256, channel_mults=(1, 2, 3), num_res_blocks=2, attention_levels=(1, 2),
                 attention_layers=(0, 1, 5), attention_ffn=True, mid_attention=True, **attn)],
        # The study's single-resolution arm at this size: the outer's levels followed by the inner's.
        single=dict(base_channels=64, channel_mults=(1, 2, 4, 8, 12), num_res_blocks=2, attention_levels=(3, 4),
                    attention_layers=(0, 0, 0, 1, 5), attention_ffn=True, mid_attention=True, **attn),
        num_classes=1000, skip_inner_input=False))                          # yaml:73 skip_inner_unet_input false
    # yaml:12-24: 1000 steps, DEEPFLOYD (squaredcos_cap_v2), V_PREDICTION, loss target DDPM (eps), shifted
    # schedules; yaml:108 mixed_ratio '2:1' (diffusion.py:309-313: cumsum -> high resolution on the first 2/3).
    c.diffusion = ml_collections.ConfigDict(dict(
        schedule="squaredcos_cap_v2", num_timesteps=1000, power=1.0, prediction="v", loss_target="eps",
        level_weights=None, mixed_ratio=(2.0 / 3.0, 1.0), cond_drop_prob=0.1))
    # yaml:109-116 and clis/train_parallel.py:120-133: Adam(lr 5e-5, eps 1e-8), 10k linear warm-up steps then
    # constant (lr_scaler.py), gradient clipping at norm 2; yaml:26 one million steps.
    c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=5e-5, schedule="constant",
                                                 warmup_steps=10000, grad_clip=2.0, eps=1e-8))
    c.num_steps = 1_000_000
    c.inner_steps = 0
    c.batch_size = 192
    # What experiments.scale compiles: the NestedUNet train step (float32, as yaml:117 fp16 0), parameters and
    # Adam moments sharded over 'data' (FSDP), the batch over 'data'.
    c.scale = ml_collections.ConfigDict(dict(
        batch_size=192, paper_hardware="8 A100s for ImageNet (the paper's training details)",
        paper_time="not stated in the official code",
        source="apple/ml-mdm@de8cde2 ml-mdm-matryoshka/configs/models/cc12m_256x256.yaml:12-79,107-117, "
               "ml_mdm/diffusion.py:309-313, ml_mdm/clis/train_parallel.py:120-133; batch 192 = yaml:107's "
               "commented 24 per GPU x the paper's 8 GPUs"))
  return c
