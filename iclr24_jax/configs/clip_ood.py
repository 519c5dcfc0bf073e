"""clip_ood: "Does CLIP's Generalization Performance Mainly Stem from High Train-Test Similarity?"
(Mayilvahanan et al., ICLR 2024, https://arxiv.org/abs/2310.09562, code: github.com/brendel-group/clip-ood).

Run:  python -m experiments.main --config=configs/clip_ood.py:tiny --workdir=runs/clip_ood
Variants (after the colon):
  ''                  the digits analogue of LAION / ImageNet / the OOD benchmarks (iclr24_jax/papers/clip_ood/data.py):
                      dedup, CLIP on the full pool (= the reference embedding), similarity-pruned, random same-size,
                      most- and least-similar half splits; 400 steps each (about 3-5 CPU minutes in all)
  'tiny'              a seconds-long smoke run of the same pipeline
  'candidates'        prune with the official per-test-point candidate search (top-k per query, k=num_candidates)
  'prune_<benchmark>' prune against one benchmark only (clean, sketch, inverted, rotated, noisy, lowres), as the
                      paper's per-benchmark splits
  'no_dedup'          skip the near-duplicate removal
  'vit'               a small ViT image tower instead of the CNN
  'minilm'            frozen all-MiniLM-L6-v2 caption embeddings + a trainable projection as the text tower
  'paper'             the paper's training run: OpenCLIP ViT-B/32 at batch 33,600 (compiled ahead of time by
                      `python -m experiments.scale --only clip_ood`)
"""
import math

import ml_collections

from iclr24_jax.configs import variants

BENCHMARKS = ("clean", "sketch", "inverted", "rotated", "noisy", "lowres")
VARIANTS = ("", "tiny", "candidates", "no_dedup", "vit", "minilm", "paper") + tuple(f"prune_{b}" for b in BENCHMARKS)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.paper = "clip_ood"
  c.seed = 0
  c.data = ml_collections.ConfigDict(dict(
      name="digits_pool", data_dir="", pool_size=20000, reference_size=2500, test_size=50, lowres_test_size=50,
      duplicate_fraction=0.1, contamination=0.02, class_free_prob=0.08, wrong_label_prob=0.04,
      # Calibrated to the paper's ratios (so nearest-neighbour similarities mean what they do at scale): test points /
      # reference set = 6 x 50 / 2500 = 0.12 (the paper's ~166k benchmark images / 1.28M ImageNet-train = 0.13), and the
      # reference holds each digit style in the pool's proportions (the pool's shares without 'photo'), so no benchmark
      # style (V2's stand-in 'lowres' included) is rarer in the reference than in the pool. MNIST-5k bases left for the
      # pool: 5000-2500-50.
      reference_style_rates=dict(clean=0.18, rotated=0.08, inverted=0.05, bold=0.05, small=0.04, noisy=0.06,
                                 blurry=0.04, sketch=0.06, lowres=0.09)))
  c.model = ml_collections.ConfigDict(dict(
      embed_dim=64, logit_scale_init=math.log(1 / 0.07), logit_scale_max=100.0,
      image=ml_collections.ConfigDict(dict(name="cnn", features=(16, 32), dense=64)),
      text=ml_collections.ConfigDict(dict(name="transformer", max_len=12, width=32, depth=1, heads=2))))
  # OpenCLIP: AdamW, beta2 0.98, eps 1e-6, wd 0.2 (no decay on gains / biases / logit scale), cosine with warmup
  c.optimizer = ml_collections.ConfigDict(dict(name="adamw", learning_rate=2e-3, schedule="cosine", warmup_steps=50,
                                               weight_decay=0.1, b1=0.9, b2=0.98, eps=1e-6, grad_clip=0.0))
  c.num_steps = 400                  # per split (the same number of samples seen for every split)
  c.batch_size = 256
  c.log_every = 50
  c.eval_every = 0                   # zero-shot eval during training (0: only at the end)
  c.checkpoint_every = 100           # steps of each split (and its last step)
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  # Near-duplicate removal. Deviation: in mean-centred pixel space (Pearson correlation) with threshold 0.01
  # (README): the small CLIP puts distinct digits of one class and style as close together as near-duplicates,
  # so no threshold separates them there; 0.124 is the paper's value in CLIP ViT-B/16+ space.
  c.dedup = ml_collections.ConfigDict(dict(enabled=True, space="pixels", num_clusters=100, threshold=0.01,
                                           num_iters=50))
  c.prune = ml_collections.ConfigDict(dict(chunk=1024, num_candidates=0, split_fraction=0.5, benchmarks=()))
  c.conditions = ("full", "pruned", "random", "most_similar", "least_similar")
  arg = variants.one(arg, VARIANTS, name="clip_ood")
  if arg == "tiny":
    c.data.update(dict(pool_size=1200, reference_size=300, test_size=60, lowres_test_size=40))
    c.model.embed_dim = 16
    c.model.image.update(dict(features=(4, 8), dense=16))
    c.model.text.update(dict(width=16, depth=1, heads=2))
    c.num_steps = 6
    c.batch_size = 64
    c.log_every = 3
    c.checkpoint_every = 3
    c.optimizer.warmup_steps = 0
    c.dedup.num_clusters = 8
    c.prune.chunk = 256
  elif arg == "candidates":
    c.prune.num_candidates = 50
  elif arg == "no_dedup":
    c.dedup.enabled = False
  elif arg == "vit":
    c.model.image = ml_collections.ConfigDict(dict(name="vit", patch_size=4, width=32, depth=2, heads=2))
  elif arg == "minilm":
    c.model.text = ml_collections.ConfigDict(dict(name="features", hidden=()))
  elif arg.startswith("prune_"):
    c.prune.benchmarks = (arg[len("prune_"):],)
  elif arg == "paper":
    # The paper trains CLIP with OpenCLIP on each (pruned) LAION-200M subset: brendel-group/clip-ood@0f7b418
    # README.md:35-36 (OpenCLIP, total batch 33,600). Sizes and optimizer: OpenCLIP (mlfoundations/open_clip@89fb801)
    # src/open_clip/model_configs/ViT-B-32.json:1-16 (embed 512; ViT 224 px, patch 32, 12 x 768; text 77 tokens,
    # vocabulary 49,408, 12 x 512, 8 heads) and src/open_clip_train/params.py:5-11 (ViT: AdamW lr 5e-4, betas 0.9 /
    # 0.98, eps 1e-6), :275 (32 epochs), :285 (weight decay 0.2), :288 (10,000 warm-up steps), cosine decay.
    # The evaluation suite is what this repository's loader reads; the training pairs are LAION (not loadable here).
    # Mixed precision and activation checkpointing as OpenCLIP trains: src/open_clip_train/params.py:402-406
    # (`--precision`, default amp_bf16: bf16 compute under autocast, f32 master weights) and :461-465
    # (`--grad-checkpointing`, each residual block recomputed in the backward); README.md:576 recommends it with
    # `--local-loss --gather-with-grad` to fit large batches. Towers: dtype='bfloat16' (f32 parameters), remat=True,
    # and scan=True (the blocks as one nn.scan: with remat the backward then recomputes one layer at a time).
    # Deviation: the 2023 OpenCLIP the paper used defaulted to `--precision amp` (fp16 autocast with loss scaling;
    # README.md:21 records the change to amp_bf16); bf16 needs no loss scaling and holds the same bytes.
    c.data = ml_collections.ConfigDict(dict(name="imagenet", data_dir="", image_size=224))
    c.model = ml_collections.ConfigDict(dict(
        embed_dim=512, logit_scale_init=math.log(1 / 0.07), logit_scale_max=100.0,
        image=ml_collections.ConfigDict(dict(name="vit", patch_size=32, width=768, depth=12, heads=12, pool="cls",
                                             dtype="bfloat16", remat=True, scan=True)),
        text=ml_collections.ConfigDict(dict(name="transformer", max_len=77, width=512, depth=12, heads=8,
                                            vocab_size=49408, dtype="bfloat16", remat=True, scan=True))))
    c.optimizer = ml_collections.ConfigDict(dict(name="adamw", learning_rate=5e-4, schedule="cosine",
                                                 warmup_steps=10000, weight_decay=0.2, b1=0.9, b2=0.98, eps=1e-6,
                                                 grad_clip=0.0))
    c.batch_size = 33600
    c.num_steps = 190_476        # 32 epochs of the ~200M de-duplicated LAION pairs at 33,600 per step
    c.scale = ml_collections.ConfigDict(dict(
        batch_size=33600,
        paper_hardware="one node of 8 A100s (the paper's training details: ViT-B/32, 32 epochs, batch 33,600)",
        paper_time="several days per pruned data set, depending on its size (the paper's training details)",
        source="brendel-group/clip-ood@0f7b418 README.md:35-36; mlfoundations/open_clip@89fb801 "
               "src/open_clip/model_configs/ViT-B-32.json:1-16, src/open_clip_train/params.py:5-11,275,285,288,"
               "402-406,461-465, README.md:576"))
  return c
