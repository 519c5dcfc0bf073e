"""DA-CLIP: Controlling Vision-Language Models for Multi-Task Image Restoration (Luo et al., ICLR 2024).

Paper: https://openreview.net/forum?id=t3vnnLeajU   Official code: https://github.com/Algolzw/daclip-uir

Run:  python -m experiments.main --config=configs/daclip.py:tiny --workdir=runs/daclip_tiny
      python -m experiments.main --config=configs/daclip.py --workdir=runs/daclip          # the CPU-scale study
Variants (after the colon): '' (32x32 grey MNIST-5k, the reproduction's scale), 'tiny' (seconds), 'digits'
(scikit-learn digits upsampled to 32x32 instead of MNIST-5k), 'one_seed' (one controller and one restorer seed:
the main job's miniature), 'paper' (the official DA-CLIP ViT-B/32 controller
training on the ten-degradation data set, compiled ahead of time by `python -m experiments.scale --only daclip`).
Pipeline: stage 0 a small CLIP (ViT + text transformer) on clean digits with captions -> frozen; stage 1 the
DA-CLIP controller on degraded digits (7 degradation types, names as text) -> e_c, e_d; stage 2 IR-SDE restorers
(diffusion.UNet) for the conditions no embedding / DA-CLIP / shuffled e_d / oracle one-hot type, `num_seeds`
seeds each, trained one after another through one compiled program; restored test images scored by PSNR / SSIM
per degradation.
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "tiny", "digits", "paper", "one_seed")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The DA-CLIP config: the CPU-scale study on 32x32 MNIST-5k (CLIP, controller, IR-SDE restorers, 3 seeds).

  Args:
    arg: comma-separated variants: 'tiny' (seconds), 'digits' (scikit-learn digits upsampled to 32x32), 'one_seed'
      (one controller and one restorer seed: the main job's miniature), 'paper'
      (the official ViT-B/32 sizes); None or '' gives the default.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "daclip"
  c.seed = 0
  c.data = ml_collections.ConfigDict(dict(name="mnist5k", data_dir="", image_size=32, num_train=4000, num_test=700,
                                          train_copies=1, test_per_type=12))
  # Stage 0: CLIP from scratch (no CLIP weights offline). ViT-B/32 in the paper; a 4-block ViT here.
  c.clip = ml_collections.ConfigDict(dict(
      model=dict(embed_dim=64, image=dict(name="vit", patch_size=4, width=64, depth=4, heads=4, pool="cls"),
                 text=dict(name="transformer", max_len=10, width=64, depth=2, heads=4)),
      optimizer=dict(learning_rate=1e-3, schedule="cosine", warmup_steps=20, weight_decay=0.1),
      num_steps=200, batch_size=128))
  # Stage 1: the controller (official: AdamW lr 2e-5, wd 0.05, batch 784, 30 epochs from OpenCLIP ViT-B/32).
  c.controller = ml_collections.ConfigDict(dict(
      optimizer=dict(learning_rate=5e-4, schedule="cosine", warmup_steps=20, weight_decay=0.05),
      num_steps=200, batch_size=128, seeds=3))   # seeds: controllers trained for (a); seed 0's feeds stage 2
  # Stage 2: IR-SDE (official train.yml: max_sigma 50, T 100, cosine, eps 0.005).
  c.sde = ml_collections.ConfigDict(dict(T=100, lambda_=50.0 / 255.0, schedule="cosine", eps=0.005))
  # The restorer (official ConditionalUNet: nf 64, ch_mult [1, 2, 4, 8], cross-attention at the lowest levels).
  # CPU scale: 8 base channels, 3 levels (32, 16, 8), self- and cross-attention at 8x8 and in the middle.
  c.model = ml_collections.ConfigDict(dict(name="unet", base_channels=8, channel_mults=(1, 2, 2), num_res_blocks=1,
                                           attention_levels=(2,), mid_attention=True, num_heads=2, out_channels=1,
                                           num_groups=4))
  # Official (options/train.yml): AdamW lr 2e-4, betas (0.9, 0.99), TrueCosineAnnealingLR to eta_min 1e-6 over 700k
  # iterations, no warm-up, batch 16 of 256x256.
  # Deviation: lr 2e-3 with 20 warm-up steps and cosine to 2e-5 (end_factor 0.01): 10x the official rate, because
  # the CPU-scale restorers get 400 steps, not 700k (at 2e-4 the L1 matching loss barely moves in 400 steps).
  c.optimizer = ml_collections.ConfigDict(dict(name="adamw", learning_rate=2e-3, schedule="cosine", warmup_steps=20,
                                               end_factor=0.01, b1=0.9, b2=0.99, weight_decay=0.0))
  c.num_steps = 400
  c.batch_size = 16
  c.conditions = ("none", "daclip", "shuffled", "oracle")
  c.num_seeds = 3
  c.restoration = True          # False: stages 0-1 and the degradation accuracies only (no IR-SDE restorers)
  c.restore_method = "posterior"  # official test.yml / validation (sampling_mode: posterior); 'sde': reverse SDE
  # The restoration rows. PSNR rewards the posterior mean, and one posterior sample scores below it by the posterior
  # variance (for a Gaussian posterior 3 dB): the PSNR rows score the mean of `restore_samples` chains, for the
  # conditions in `restore_conditions` (the sampling cost is chains x conditions x seeds). The held-out matching
  # loss (the training objective on the test images, `heldout_times` stratified times per image, the same draws for
  # every model) is measured for every condition.
  # Deviation: the official test script scores one posterior sample per image.
  c.restore_conditions = ("none", "daclip")
  c.restore_samples = 4
  c.heldout_times = 10
  c.log_every = 100
  c.eval_every = 0              # evaluation at the end only
  # Each stage (clip, controller, controller_s<k>, restorer_<condition>_s<seed>) saves in workdir/<stage> every
  # checkpoint_every of its own steps and when checkpoint_every_secs passed since its last save, at its chunk ends
  # (every log_every steps); each stage's final state is saved when it ends. A stage's blocking save measured 0.15-0.8 s
  # (tiny, 2-core CPU at load ~9): at 200 the default run saves ~28 times (12 restorers at step 200, 16 final
  # states), ~11 s of a run of ~1,700 CPU-s.
  c.checkpoint_every = 200
  c.checkpoint_every_secs = 600.0
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))

  parts = variants.parse(arg, VARIANTS, name="daclip")
  if "digits" in parts:
    c.data.name = "digits"
    c.data.num_train = 1400
    c.data.num_test = 397
  if "tiny" in parts:
    c.data.update(dict(image_size=16, num_train=64, num_test=28, test_per_type=2))
    c.clip.model.image.update(dict(width=16, depth=2, heads=2))
    c.clip.model.update(dict(embed_dim=16))
    c.clip.model.text.update(dict(width=16, depth=1, heads=2))
    c.clip.update(dict(num_steps=4, batch_size=16))
    c.controller.update(dict(num_steps=4, batch_size=16))
    c.sde.T = 4
    c.model.update(dict(base_channels=8, channel_mults=(1,), attention_levels=(0,), num_heads=2, num_groups=4))
    c.num_steps = 3
    c.batch_size = 8
    c.num_seeds = 2
    c.log_every = 1
    c.checkpoint_every = 2      # mid-stage saves (every stage runs 3-4 steps), so a resume test cuts a stage
    c.restore_conditions = ("none", "daclip", "shuffled", "oracle")
    c.restore_samples = 2
    c.heldout_times = 2
  if "one_seed" in parts:
    # The main job's miniature (study.reproduce): one controller and one restorer seed, same data and steps; the
    # 3-seed study runs by name (daclip_seeds) and is tabled from its recorded rows.
    c.controller.seeds = 1
    c.num_seeds = 1
  if "paper" in parts:
    # The official runs, Algolzw/daclip-uir@c2cc141. DA-CLIP (stage 1): da-clip/src/multi_train.sh:1-18 (4 GPUs x
    # batch 784, AdamW lr 3e-5, weight decay 0.05, 100 warm-up steps, 100 epochs, daclip_ViT-B-32 from OpenCLIP's
    # laion2b_s34b_b79k) with da-clip/src/open_clip/model_configs/daclip_ViT-B-32.json:1-17 (embed 512; ViT 224
    # px, patch 32, 12 x 768; text 77 tokens, 12 x 512, 8 heads); OpenCLIP's ViT betas (0.9, 0.98), eps 1e-6, cosine
    # decay.
    c.data = ml_collections.ConfigDict(dict(name="universal", data_dir="", image_size=224))
    c.clip.model = ml_collections.ConfigDict(dict(
        embed_dim=512, image=dict(name="vit", patch_size=32, width=768, depth=12, heads=12, pool="cls"),
        text=dict(name="transformer", max_len=77, width=512, depth=12, heads=8, vocab_size=49408)))
    c.clip.num_steps = 0           # stage 0 is OpenCLIP's pretrained ViT-B/32 (laion2b_s34b_b79k), not trained here
    # num_steps sets the cosine schedule's length: 100 epochs of the training csv at 3,136 pairs per step (the
    # step count of a local copy is 100 x rows / 3,136; 10,000 stands for ~313k pairs).
    c.controller = ml_collections.ConfigDict(dict(
        optimizer=dict(learning_rate=3e-5, schedule="cosine", warmup_steps=100, weight_decay=0.05, b1=0.9, b2=0.98,
                       eps=1e-6),
        num_epochs=100, num_steps=10_000, batch_size=3136, seeds=1))
    # Stage 2 (not compiled here): universal-image-restoration/config/daclip-sde/options/train.yml:8-12 (IR-SDE
    # max_sigma 50, T 100, cosine, eps 0.005), :31-32 (batch 16 of 256 x 256 patches), :44-52 (ConditionalUNet nf 64,
    # ch_mult [1, 2, 4, 8], context 512), :63-72 (AdamW lr 2e-4, betas (0.9, 0.99), cosine to 1e-6 over 700k).
    # Deviation: the closest diffusion.UNet: two ResBlocks per level and softmax attention with cross-attention
    # at the 512-channel level and the middle (DenoisingUNet_arch.py:21-103: linear attention at levels 0-2,
    # spatial transformers with 32-wide heads at level 3 and the middle, a 7 x 7 stem).
    c.sde = ml_collections.ConfigDict(dict(T=100, lambda_=50.0 / 255.0, schedule="cosine", eps=0.005))
    c.model = ml_collections.ConfigDict(dict(name="unet", base_channels=64, channel_mults=(1, 2, 4, 8),
                                             num_res_blocks=2, attention_levels=(3,), mid_attention=True,
                                             num_heads=16, out_channels=3, num_groups=32))
    c.optimizer = ml_collections.ConfigDict(dict(name="adamw", learning_rate=2e-4, schedule="cosine", warmup_steps=0,
                                                 end_factor=1e-6 / 2e-4, b1=0.9, b2=0.99, weight_decay=0.0))
    c.num_steps = 700_000
    c.batch_size = 16
    # What experiments.scale compiles: the controller's train step (stage 1), the trainable controller and its
    # AdamW moments FSDP-sharded over 'data' with the frozen encoder, the batch over 'data'.
    c.scale = ml_collections.ConfigDict(dict(
        batch_size=3136,
        paper_hardware="4 GPUs (da-clip/src/multi_train.sh:1 torchrun --nproc_per_node 4; model not stated)",
        paper_time="not stated in the official code",
        source="Algolzw/daclip-uir@c2cc141 da-clip/src/multi_train.sh:1-18, "
               "da-clip/src/open_clip/model_configs/daclip_ViT-B-32.json:1-17, "
               "universal-image-restoration/config/daclip-sde/options/train.yml:8-72"))
  return c
