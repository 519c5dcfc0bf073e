"""Co-Boosting: one-shot federated learning by boosting synthetic data and the ensemble together (ICLR 2024).

Paper: https://arxiv.org/abs/2402.15070 (ICLR 2024)
Official code: https://github.com/rong-dai/Co-Boosting
Run:   python -m experiments.main --config=configs/coboosting.py:tiny --workdir=runs/coboosting
Variants (comma-separated after the colon):
  ''            MNIST-5k, 10 clients, Dirichlet 0.1, the official defaults (200 epochs, 30 generator steps,
                batch 128, 100 local epochs): hours on a CPU, minutes on a GPU
  'tiny'        digits, 3 small clients, 2 epochs: seconds (smoke test)
  'digits'      scikit-learn digits (8x8) instead of MNIST-5k
  'reproduce'   the reduced CPU budget of `study.reproduce` (digits, 10 small CNN clients, 30 epochs)
  'alpha=<a>'   Dirichlet concentration (e.g. alpha=0.1, alpha=0.3, alpha=0.5)
  'hetero'      heterogeneous client architectures (two CNN widths and an MLP); no FedAvg
  'coboosting' / 'dense' / 'fedavg' / 'ensemble'   run only that method
  'compare'     Co-Boosting and all three baselines in one run
  'paper'       the official CIFAR-10 run (co_boosting.sh, fl_pretrain.sh): 10 CNNCifar clients, Dirichlet 0.6;
                compiled ahead of time by `python -m experiments.scale --only coboosting`
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("tiny", "digits", "reproduce", "alpha=<a>", "hetero", "coboosting", "dense", "fedavg", "ensemble",
            "compare", "paper")
METHODS = ("coboosting", "dense", "fedavg", "ensemble")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The Co-Boosting config: MNIST-5k, 10 clients, Dirichlet 0.1 and the official budgets unless `arg` changes them.

  Args:
    arg: comma-separated variants: 'tiny', 'digits', 'reproduce' (budgets, applied first), 'alpha=<a>',
      'hetero' (mixed client architectures, no FedAvg), a single method ('coboosting', 'dense', 'fedavg',
      'ensemble'), 'compare' (all four) or 'paper' (the official CIFAR-10 sizes); None or '' gives the default.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant, or alpha not a positive number.
  """
  c = ml_collections.ConfigDict()
  c.paper = "coboosting"
  c.seed = 0
  c.data = ml_collections.ConfigDict(dict(name="mnist5k", data_dir=""))
  c.fl = ml_collections.ConfigDict(dict(num_clients=10, alpha=0.1, same_init=True))
  # Clients: official fl_pretrain.sh (SGD lr 0.01, momentum 0.9, 100 local epochs, batch 128, clip 10).
  # Deviation: the foundation's small CNN instead of the official 3x128-channel CNNCifar.
  cnn = dict(name="cnn", features=(32, 64), dense=128)
  c.client = ml_collections.ConfigDict(dict(
      models=(cnn,), local_epochs=100, batch_size=128, vmap="auto",
      optimizer=ml_collections.ConfigDict(dict(name="sgd", learning_rate=0.01, momentum=0.9, grad_clip=10.0,
                                               weight_decay=0.0))))
  c.model = ml_collections.ConfigDict(cnn)  # the server (official: the same 'cnn' as the clients)
  c.generator = ml_collections.ConfigDict(dict(ngf=64, nz=256))
  # Official datafree_kd.py / co_boosting.sh defaults.
  c.coboost = ml_collections.ConfigDict(dict(
      g_steps=30, lr_g=1e-3, gen_grad_clip=10.0, hardness=1.0, oh_weight=1.0, adv_weight=1.0, adv_temperature=3.0,
      mu=0.01, mu_decay=0.99, ods_eps=8.0 / 255.0, ods_temperature=4.0, kd_temperature=4.0))
  # Server distillation: SGD(lr 0.01, momentum 0.9, wd 1e-4), grad clip 10, cosine over the epochs.
  c.optimizer = ml_collections.ConfigDict(dict(name="sgd", learning_rate=0.01, momentum=0.9, weight_decay=1e-4,
                                               grad_clip=10.0, schedule="cosine"))
  c.num_epochs = 200  # the paper's budget: server epochs (one synthesis + one pass over the pool each)
  c.batch_size = 128
  c.methods = ("coboosting", "fedavg", "ensemble")
  c.log_every = 1         # epochs
  c.eval_every = 10       # epochs
  # Checkpoints (common.loop.CheckpointHook in coboost.fit): every N epochs and/or every N wall seconds, whichever
  # comes first; SIGTERM / SIGINT save at the next epoch's end. A save holds the server, the ensemble weights and
  # the pool buffer (official MNIST sizes: 200 x 128 images, 80 MB), written in the background.
  c.checkpoint_every = 10  # epochs (0: not by epochs)
  c.checkpoint_every_secs = 600.0
  c.plots = True
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  parts = variants.parse(arg, VARIANTS, name="coboosting")
  # Budget variants first, so 'hetero' / 'alpha=' / methods apply on top of them in any order.
  parts.sort(key=lambda p: 0 if p in ("tiny", "digits", "reproduce", "paper") else 1)
  for part in parts:
    if part == "tiny":
      c.data.name = "digits"
      c.fl.num_clients = 3
      c.fl.alpha = 0.5
      small = dict(name="cnn", features=(4, 8), dense=16)
      c.client.models = (small,)
      c.client.local_epochs = 3
      c.client.batch_size = 32
      c.model = ml_collections.ConfigDict(small)
      c.generator.ngf = 4
      c.generator.nz = 16
      c.coboost.g_steps = 2
      c.num_epochs = 2
      c.batch_size = 16
      c.eval_every = 1
      c.checkpoint_every = 1  # mid-run checkpoints, so the resume tests can cut the 2 epochs in two
      c.methods = METHODS
    elif part == "paper":
      # The official run, rong-dai/Co-Boosting@b95d715: fl_pretrain.sh:1-6 (CIFAR-10, Dirichlet beta 0.6, 10
      # clients, model cnn, SGD lr 0.01 (fl_pretrain.py:49 momentum 0.9), 100 local epochs, batch 128),
      # co_boosting.sh:1-13 (teacher and student cnn, batch 128, kd_lr 0.01, 200 epochs, 30 generator steps, lr_g
      # 1e-3, seed 42), datafree_kd.py:101-105 (server momentum 0.9, weight decay 1e-4), :224-225 (Generator nz 256,
      # ngf 64);
      # datafree/models/classifiers/cnncifar.py:4-11 (CNNCifar: three 3 x 3 convs of 128 channels, 319k parameters).
      c.data.name = "cifar10"
      c.seed = 42
      c.fl.alpha = 0.6
      cnn = dict(name="cnn_cifar", width=128)
      # vmap False: unrolled clients keep a batch sharded over 'data' sharded (see study.scale_program).
      c.client = ml_collections.ConfigDict(dict(models=(cnn,), local_epochs=100, batch_size=128, vmap=False,
                                                optimizer=c.client.optimizer))
      c.model = ml_collections.ConfigDict(cnn)
      c.generator = ml_collections.ConfigDict(dict(ngf=64, nz=256))
      c.coboost.g_steps = 30
      c.coboost.lr_g = 1e-3
      c.optimizer.learning_rate = 0.01
      c.num_epochs = 200
      c.batch_size = 128
      c.methods = ("coboosting",)
      # What experiments.scale compiles: the official run's last (largest) epoch as one program: 30 generator
      # steps, the ensemble re-weighting pass over the 199 earlier pool batches and the distillation pass over all
      # 200, batches of 128 sharded over 'data', the tiny networks replicated.
      c.scale = ml_collections.ConfigDict(dict(
          batch_size=128, pool_batches=200,
          paper_hardware="one GPU (.cuda() without a device flag, e.g. datafree/synthesis/coboost.py:52; model not "
                         "stated)",
          paper_time="not stated in the official code",
          source="rong-dai/Co-Boosting@b95d715 co_boosting.sh:1-13, fl_pretrain.sh:1-6, fl_pretrain.py:49, "
                 "datafree_kd.py:101-105,224-225, datafree/models/classifiers/cnncifar.py:4-11"))
    elif part == "digits":
      c.data.name = "digits"
    elif part == "reproduce":
      # Deviation (CPU budget): 8x8 digits, a small CNN, Adam clients for 60 local epochs instead of SGD for
      # 100, 30 server epochs of 20 generator steps at batch 64 with a larger server lr (0.05) to make up
      # for ~200x fewer distillation steps than the official 200 epochs x 200 pool batches.
      c.data.name = "digits"
      small = dict(name="cnn", features=(16, 32), dense=64)
      c.client.models = (small,)
      c.client.local_epochs = 60
      c.client.batch_size = 64
      c.client.optimizer.name = "adam"
      c.client.optimizer.learning_rate = 1e-3
      c.model = ml_collections.ConfigDict(small)
      c.generator.ngf = 16
      c.coboost.g_steps = 20
      c.num_epochs = 30
      c.batch_size = 64
      c.optimizer.learning_rate = 0.05
      c.eval_every = 1  # every epoch, as the official code (it reports the best epoch's test accuracy)
      c.methods = METHODS
    elif part.startswith("alpha="):
      try:
        c.fl.alpha = float(part.split("=", 1)[1])
      except ValueError as e:
        raise ValueError(f"'{part}': alpha must be a number, e.g. alpha=0.3.") from e
      if not c.fl.alpha > 0:
        raise ValueError(f"'{part}': alpha must be positive.")
    elif part == "hetero":
      # Three architectures cycled over the clients: the base CNN, a half-width CNN and an MLP.
      base = dict(c.client.models[0])
      f, d = tuple(base["features"]), int(base["dense"])
      c.client.models = (base, dict(name="cnn", features=tuple(max(2, w // 2) for w in f), dense=max(4, d // 2)),
                         dict(name="mlp", hidden=(2 * d, d)))
      c.methods = tuple(m for m in c.methods if m != "fedavg")
    elif part in METHODS:
      c.methods = (part,)
    elif part == "compare":
      c.methods = METHODS
  return c
