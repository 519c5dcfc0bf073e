"""nci: Learning Conditional Invariances through Non-Commutativity (ICLR 2024).

Paper: https://openreview.net/forum?id=tUVG9nGzgE -- official code: https://github.com/abhrac/nci
Run:   python -m experiments.main --config=configs/nci.py:tiny --workdir=runs/nci
Variants: '' (NCI, target = digits), 'tiny', 'reproduce' (the settings of the leave-one-domain-out study,
          NCI and DANN on one lambda ramp), 'pretrained' (the paper's setting in miniature: a featurizer pretrained
          on a held-out labelled pool of every style, then fine-tuned at a 10x lower learning rate),
          'erm' / 'dann' / 'oracle' (baselines), 'target=<domain>' (e.g. target=mnist_rot60), 'paper' (the official
          PACS run with DomainBed's ResNet-50 at 224 x 224, compiled ahead of time by
          `python -m experiments.scale --only nci`).
"""
import ml_collections

from iclr24_jax.configs import variants

# The five digit styles of papers/nci/data.py (a test checks they agree); a config imports no paper module.
DOMAINS = ("mnist", "mnist_rot30", "mnist_rot60", "mnist_inv", "digits")
METHODS_AND_SIZES = ("tiny", "reproduce", "pretrained", "erm", "dann", "nci", "oracle", "paper")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The NCI config: NCI on the five digit domains with 'digits' as the target unless `arg` changes it.

  Args:
    arg: comma-separated variants: 'tiny', 'reproduce' (the leave-one-domain-out study's settings), 'pretrained'
      (pool pretraining + low-lr fine-tuning, study.reproduce_pretrained; 'pretrained,tiny' for a smoke run), a
      baseline ('erm', 'dann', 'oracle'), 'target=<domain>' (one of DOMAINS) and 'paper' (the official PACS
      sizes); None or '' gives the default.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant or target domain.
  """
  c = ml_collections.ConfigDict()
  c.paper = "nci"
  c.seed = 0
  c.method = "nci"
  c.data = ml_collections.ConfigDict(dict(name="digit_domains", data_dir="", domains=DOMAINS, target="digits",
                                          image_size=16, uda_fraction=0.2, max_per_domain=0,
                                          pool_fraction=0.0))  # > 0: hold out a pretraining pool ('pretrained')
  # Featurizer+classifier: DomainBed's MNIST_CNN (narrower) instead of the paper's ResNet-50; linear
  # discriminator as in the official code (nonlinear_classifier=False).
  c.model = ml_collections.ConfigDict(dict(name="mnist_cnn", widths=(32, 64), features=(32, 64), dense=128,
                                           discriminator="linear"))
  # Deviation: the paper's lr 5e-5 / batch 32 / 5,000 steps are for a pretrained ResNet-50; a CNN trained
  # from scratch on small digit images uses DomainBed's small-image defaults (Adam, lr 1e-3), fewer steps.
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=1e-3, schedule="constant",
                                               weight_decay=0.0))
  c.adv_weight = -1.0  # lambda; -1 = the official code's 1/K (adversarial CE divided by the number of sources)
  # lambda schedule: 'official' (NCI constant as the official code, DANN on Ganin et al.'s ramp), 'ramp' (both
  # on the ramp) or 'constant' (both constant); the study compares them on one schedule ('ramp').
  c.adv_schedule = "official"
  # The 'pretrained' setting: ERM on the pool for `steps` (batch per style), then every arm fine-tunes from it.
  c.pretrain = ml_collections.ConfigDict(dict(steps=400, learning_rate=1e-3, batch_size=32))
  c.fresh_head = False  # True: a fresh head per seed on the pretrained featurizer (DomainBed's new nn.Linear)
  c.num_steps = 1500
  c.batch_size = 32
  c.log_every = 100
  c.eval_every = 500
  c.checkpoint_every = 500
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  for part in variants.parse(arg, METHODS_AND_SIZES + ("target=<domain>",), name="nci"):
    if part == "tiny":
      c.num_steps = 20
      c.log_every = 10
      c.eval_every = 10
      c.checkpoint_every = 10
      c.model.widths = (8, 16)
      c.data.max_per_domain = 200
      c.batch_size = 16
      c.pretrain.steps = 10
    elif part == "reproduce":
      c.num_steps = 250  # 65 runs (5 targets x (ERM, DANN, NCI at two lambdas) x 3 seeds + 5 oracles) in ~the
      c.adv_schedule = "ramp"  # CPU time the earlier 50 runs of 300 steps took
      c.model.widths = (16, 32)
    elif part == "pretrained":
      # Deviation (scaled): the paper fine-tunes an ImageNet ResNet-50 at lr 5e-5 for 5,000 steps; here a
      # 25% labelled pool of every style (the target's too, as ImageNet covers the benchmarks' styles)
      # pretrains the small CNN, which is then fine-tuned at lr 1e-4 (10x below the from-scratch 1e-3).
      c.data.pool_fraction = 0.25
      c.pretrain.steps = 400
      c.pretrain.learning_rate = 1e-3
      c.optimizer.learning_rate = 1e-4
      c.num_steps = 150
      c.adv_schedule = "ramp"
      c.model.widths = (16, 32)
    elif part == "paper":
      # The official run, abhrac/nci@d475ba1: README.md:18 (main.py --algorithm=NCI --dataset=PACS
      # --uda_holdout_fraction=0.2 --task=domain_adaptation --batch_size=64: 64 images per source domain and of the
      # target's adaptation split), hparams_registry.py:30-35 (ResNet-50, not ResNet-18; dropout 0; linear
      # discriminator), :151 (lr 5e-5 for 224 x 224 data sets), :156 (weight decay 0), algorithms.py:84-105 (Adam
      # for the featurizer + classifier and for the discriminator, same lr), datasets.py:55 (5,001 steps),
      # networks.py:77-98 (torchvision ResNet-50, ImageNet weights, BatchNorm frozen: an affine per channel here).
      c.data = ml_collections.ConfigDict(dict(name="pacs", data_dir="", domains=("art_painting", "cartoon", "photo",
                                                                               "sketch"),
                                              target="sketch", image_size=224, uda_fraction=0.2, max_per_domain=0,
                                              pool_fraction=0.0))
      c.model = ml_collections.ConfigDict(dict(name="resnet50", norm="affine", discriminator="linear"))
      c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=5e-5, schedule="constant",
                                                   weight_decay=0.0))
      c.num_steps = 5001
      c.batch_size = 64
      c.eval_every = 300               # datasets.py:235 (PACS CHECKPOINT_FREQ 300)
      c.checkpoint_every = 300
      c.scale = ml_collections.ConfigDict(dict(
          batch_size=64, num_sources=3, paper_hardware="one GPU (main.py:52,99-100 --device 0; model not stated)",
          paper_time="not stated in the official code",
          source="abhrac/nci@d475ba1 README.md:18, main.py:52, hparams_registry.py:30-35,151,156, "
                 "algorithms.py:84-105, "
                 "datasets.py:55,235, networks.py:77-98"))
    elif part in ("erm", "dann", "nci", "oracle"):
      c.method = part
    elif part.startswith("target="):
      c.data.target = part.split("=", 1)[1]
      if c.data.target not in DOMAINS:
        raise ValueError(f"unknown target domain '{c.data.target}'; choose from {DOMAINS}.")
  return c
