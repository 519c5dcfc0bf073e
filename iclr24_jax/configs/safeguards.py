"""Classification with Conceptual Safeguards (ICLR 2024): https://arxiv.org/abs/2411.04342

Run:  python -m experiments.main --config=configs/safeguards.py:tiny --workdir=runs/safeguards
Variants (after the colon): '' (the paper's synthetic generator, the default), 'tiny', 'digits' (a real concept
data set: eight concepts computed from scikit-learn digit images, target "the digit is even"), 'digits_tiny',
'paper' (CUB with the official Inception-v3 embeddings and 112 concepts, compiled ahead of time by
`python -m experiments.scale --only safeguards`).
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "tiny", "digits", "digits_tiny", "paper")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The Conceptual Safeguards config: the paper's synthetic generator (100,000 rows, 3 seeds) by default.

  Args:
    arg: '' (synthetic), 'tiny', 'digits' (eight concepts computed from scikit-learn digits, target "even"),
      'digits_tiny' or 'paper' (CUB at the official sizes); None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "safeguards"
  c.seed = 0
  c.num_seeds = 3            # reproduction: seeds (detectors, data draw / split) each comparison is judged on
  # The synthetic generator of the official code (scripts/generate_synthetic_datasets.py): 100,000 rows,
  # x ~ Bern(0.7)^5, concepts = noisy parities of feature triples, y ~ Bern(sigmoid(c0 + 2 c1 + 3 c2 - 2)).
  c.data = ml_collections.ConfigDict(dict(name="synthetic", data_dir="", num_samples=100_000, seed=0,
                                          concept_noise=(0.3, 0.3, 0.3), target="even"))
  # Concept detectors: one 100-unit MLP per concept (official MLPConceptModel default).
  c.model = ml_collections.ConfigDict(dict(name="concept_mlp", hidden=100))
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=1e-3, schedule="constant",
                                               warmup_steps=0, weight_decay=0.0, grad_clip=0.0))
  c.num_steps = 1000
  c.batch_size = 256
  c.calibration = ml_collections.ConfigDict(dict(method="platt"))            # 'platt' | 'temperature' | 'none'
  c.front_end = ml_collections.ConfigDict(dict(inverse_c=1.0, num_iters=25))   # sklearn LogisticRegression(C=1)
  # target_accuracies: the first is the main setting; the others show how the comparison depends on it.
  c.safeguard = ml_collections.ConfigDict(dict(
      target_accuracies=(0.9, 0.8), method="exact", num_samples=1000,
      budget_fractions=(0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0), num_random_seeds=5))
  # Baseline: a selective classifier trained directly on x (same threshold rule).
  c.baseline = ml_collections.ConfigDict(dict(enabled=True, num_steps=1000,
                                              model=ml_collections.ConfigDict(dict(name="mlp", hidden=(100,)))))
  c.log_every = 100
  c.steps_per_call = 50      # detector steps per compiled call (one lax.scan chunk); log_every is a multiple
  c.eval_every = 0
  c.checkpoint_every = 250  # a multiple of steps_per_call
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.save_checkpoints = True    # False: train without orbax checkpoints (metrics.jsonl is still written)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  arg = variants.one(arg, VARIANTS, name="safeguards")
  if arg in ("tiny", "digits_tiny"):
    c.num_steps = 60
    c.baseline.num_steps = 60
    c.log_every = 20
    c.steps_per_call = 20
    c.checkpoint_every = 20
    c.safeguard.budget_fractions = (0.0, 0.5, 1.0)
    c.safeguard.num_random_seeds = 2
    c.data.num_samples = 2000
    c.save_checkpoints = False
    c.safeguard.target_accuracies = c.safeguard.target_accuracies[:1]
  if arg in ("digits", "digits_tiny"):
    c.data.name = "digits"
    c.model = ml_collections.ConfigDict(dict(name="cnn", features=(32, 64), dense=128, dropout=0.0))
    c.baseline.model = ml_collections.ConfigDict(dict(name="cnn", features=(32, 64), dense=128, dropout=0.0))
    c.batch_size = 64
    c.safeguard.target_accuracies = (0.95,) if arg == "digits_tiny" else (0.95, 0.9)
    if arg == "digits":
      c.num_steps = 1500
      c.baseline.num_steps = 1500
    else:
      c.model.features = (8, 16)
      c.model.dense = 32
      c.baseline.model.features = (8, 16)
      c.baseline.model.dense = 32
  if arg == "paper":
    # The official CUB pipeline, hljames/conceptual_safeguards@c8b33a2: scripts/process_cub_datasets.py with
    # models/embedding_model.py:66-78 (torchvision Inception-v3 with ImageNet weights in eval mode, 299 x 299
    # inputs, the 2,048-d pooled features), :135 (embedding batches of 64); scripts/train_cms.py:16-48 (concept
    # models: an MLP with one hidden layer of 50 (l1), Adam lr 1e-3, batch 16, <= 100 epochs with early stopping,
    # sigmoid (Platt) calibration); the CBM preprocessing's 112 CUB concepts (data.load_cub, min_classes 10).
    # Deviation: the official target is the bird superclass (scripts/modify_cub_datasets.py:309-311); the
    # library's propagation has a binary logistic front end, so the binary CUB target (class id >= 100).
    c.data = ml_collections.ConfigDict(dict(name="cub", data_dir="", min_classes=10, val_fraction=0.2, split_seed=1,
                                            cub_target="binary", image_size=299, num_concepts=112))
    c.backbone = ml_collections.ConfigDict(dict(name="inception_v3", norm="affine"))
    c.model = ml_collections.ConfigDict(dict(name="concept_mlp", hidden=50))
    c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=1e-3, schedule="constant",
                                                 warmup_steps=0, weight_decay=0.0, grad_clip=0.0))
    c.batch_size = 16
    c.calibration = ml_collections.ConfigDict(dict(method="platt"))
    # 112 concepts: exact propagation (2^112 assignments) is out of reach; Monte Carlo with 1,000 samples.
    c.safeguard.method = "mc"
    c.safeguard.num_samples = 1000
    # What experiments.scale compiles: the safeguard's inference on a batch of 64 test images: Inception-v3
    # features, the 112 calibrated concept detectors, the propagated prediction and the variance-greedy
    # confirmation scores (both Monte Carlo, 1,000 samples), images sharded over 'data', weights replicated.
    c.scale = ml_collections.ConfigDict(dict(
        batch_size=64,
        paper_hardware="not stated in the official code (scripts/train_cms.py:25 defaults to device 'mps')",
        paper_time="not stated in the official code",
        source="hljames/conceptual_safeguards@c8b33a2 models/embedding_model.py:66-78,135, scripts/train_cms.py:16-48, "
               "scripts/modify_cub_datasets.py:309-311"))
  return c
