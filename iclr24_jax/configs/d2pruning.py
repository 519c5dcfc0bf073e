"""D2 Pruning: Message Passing for Balancing Diversity and Difficulty in Data Pruning (Maharana et al., ICLR 2024).

Paper: https://arxiv.org/abs/2310.07931 (ICLR 2024: https://iclr.cc/virtual/2024/poster/17608)
Run:   python -m experiments.main --config=configs/d2pruning.py:tiny --workdir=runs/d2pruning
Variants (after the colon): '' (digits, the default), 'mnist5k', 'tiny', 'text' (StrategyQA + MiniLM;
needs the lm core's MiniLM embedder), 'forgetting' (digits with the official difficulty score), 'paper' (the
official CIFAR-100 run's sizes: selection over 50,000 ResNet-18 embeddings and the ResNet-18 coreset step,
compiled ahead of time by `python -m experiments.scale --only d2pruning`).

Selection defaults follow the official README command (class-balanced D2, k neighbours, gamma_f = 1,
gamma_r = 0.1, sum mode, AUM-ranked hard-example cutoff); the cutoff per pruning rate follows CCS's
CIFAR-10 schedule. Deviation: the difficulty score is AUM here, not forgetting (the official CIFAR
choice): on these near-separable data sets forgetting is zero for 92-95% of examples, which leaves D2
and CCS nothing to rank (the 'forgetting' variant runs the official choice).
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "mnist5k", "tiny", "text", "forgetting", "paper")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The D2 Pruning config: digits, an MLP score / coreset model, AUM difficulty, 3 seeds, unless `arg` changes it.

  Args:
    arg: '' (digits), 'mnist5k', 'tiny', 'text' (StrategyQA + MiniLM embeddings), 'forgetting' (the
      official forgetting difficulty score) or 'paper' (the official CIFAR-100 sizes); None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "d2pruning"
  c.seed = 0
  c.data = ml_collections.ConfigDict(dict(name="digits", data_dir="", max_train=0, cache_dir=""))
  # score model and coreset model (the paper: ResNet-18 for both)
  c.model = ml_collections.ConfigDict(dict(name="mlp", hidden=(256, 128), dropout=0.0))
  # official train.py: SGD, lr 0.1, momentum 0.9, Nesterov, weight decay 5e-4, cosine schedule
  c.optimizer = ml_collections.ConfigDict(dict(name="sgd", learning_rate=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=5e-4, schedule="cosine", warmup_steps=0))
  # checkpoint_every: the score model's stage saves every this many epochs (its unit; 0: by time only)
  c.dynamics = ml_collections.ConfigDict(dict(epochs=30, batch_size=64, el2n_epochs=10, checkpoint_every=10))
  c.selection = ml_collections.ConfigDict(dict(
      methods=("d2", "random", "ccs", "kcenter", "difficulty"),  # + 'd2_nofwd': D2 without forward MP
      pruning_rates=(0.3, 0.5, 0.7),  # the abstract's range; 90% is judged on MNIST-5k
      hard_cutoff=(0.0, 0.0, 0.1),  # beta per rate (CCS CIFAR-10 schedule); the cutoff is ranked by AUM
      score_key="aum",  # difficulty for D2 / CCS / top-k: 'forgetting' | 'el2n' | 'aum' | 'variance'
      cutoff_key="aum",  # official --mis-key accumulated_margin
      k=10, gamma_forward=1.0, gamma_reverse=0.1, graph_mode="sum",
      # gamma_r is tuned per data set in the paper: chosen per pruning rate on the validation split
      gamma_reverse_grid=(0.1, 0.3, 1.0, 3.0),
      stratify="class", num_strata=50, class_balanced=True, embedding="features",
      # 'random': the official skip of D2 for a stratum with <= k members (drawn at random instead);
      # 'graph' runs D2 there too. Only score strata can be that small (classes hold hundreds here).
      small_groups="graph"))
  c.num_seeds = 3
  c.num_steps = 600  # coreset training steps = the full-data run's (30 epochs x 20 batches), for every size
  c.batch_size = 64
  c.log_every = 1  # score-model epochs between metric rows
  c.eval_every = 0
  # The coreset stage (all runs stacked) runs in chunks of checkpoint_every steps and saves at their ends; both
  # stages also save when checkpoint_every_secs passed since their last save, and on SIGTERM / SIGINT.
  c.checkpoint_every = 200
  c.checkpoint_every_secs = 600.0
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))  # coreset runs are sharded over 'data'
  arg = variants.one(arg, VARIANTS, name="d2pruning")  # '' = digits
  if arg == "tiny":
    c.model.hidden = (32,)
    c.dynamics.epochs = 4
    c.selection.methods = ("d2", "d2_nofwd", "random", "ccs", "kcenter", "difficulty")
    c.selection.pruning_rates = (0.5, 0.9)
    c.selection.hard_cutoff = (0.0, 0.3)
    c.selection.k = 5
    c.selection.gamma_reverse_grid = (0.1, 1.0)
    c.num_seeds = 1
    c.num_steps = 40
    c.dynamics.checkpoint_every = 2
    c.checkpoint_every = 10
  elif arg == "mnist5k":
    c.data.name = "mnist5k"
    c.model.hidden = (128,)  # one hidden layer keeps ~100 runs x 1,260 steps on 784-pixel inputs inside CPU minutes
    c.dynamics.epochs = 20
    # The paper's high-pruning regime, where D2 is claimed to beat CCS: 70% and 90% pruning, 5 seeds (paired: a seed's
    # runs share the training key), D2 with and without the forward pass against CCS, k-center and random
    c.selection.methods = ("d2", "d2_nofwd", "random", "ccs", "kcenter")
    c.selection.pruning_rates = (0.7, 0.9)
    c.selection.hard_cutoff = (0.1, 0.3)
    c.selection.gamma_reverse_grid = (0.1, 1.0, 3.0)
    c.num_seeds = 5
    c.num_steps = 1260  # 20 epochs x 63 batches of the 4,000 training images
  elif arg == "text":
    c.data.name = "text"
    c.data.max_train = 2000
    c.model.hidden = (128,)
    c.dynamics.epochs = 20
    c.num_steps = 640  # 20 epochs x 32 batches
    c.selection.embedding = "inputs"  # the MiniLM sentence embeddings
  elif arg == "forgetting":
    c.selection.score_key = "forgetting"
  elif arg == "paper":
    _paper(c)
  return c


def _paper(c: ml_collections.ConfigDict) -> None:
  """The official CIFAR-100 run's sizes (adymaharana/d2pruning@bf1ea46), for `experiments.scale`."""
  # Readme.MD:24: the score model, ResNet-18, batch 256, lr 0.1, 200 epochs; Readme.MD:30-38: D2 with
  # n_neighbor 5, gamma 0.1, coreset ratio 0.1, mis-ratio 0.4 (AUM), graph-mode sum, weighted sampling,
  # label-balanced; train.py:25-28,203-205: the coreset model ResNet-18, batch 256, SGD lr 0.1, momentum 0.9,
  # Nesterov, weight decay 5e-4, cosine to 1e-4 over --iterations 40000 (Readme.MD:33).
  c.data = ml_collections.ConfigDict(dict(name="cifar100", data_dir="", max_train=0, cache_dir=""))
  c.model = ml_collections.ConfigDict(dict(name="resnet18", stage_sizes=(2, 2, 2, 2), width=64, norm="batch"))
  c.optimizer = ml_collections.ConfigDict(dict(name="sgd", learning_rate=0.1, momentum=0.9, nesterov=True,
                                               weight_decay=5e-4, schedule="cosine", warmup_steps=0))
  c.dynamics = ml_collections.ConfigDict(dict(epochs=200, batch_size=256, el2n_epochs=10, checkpoint_every=10))
  c.selection.update(dict(methods=("d2",), pruning_rates=(0.9,), hard_cutoff=(0.4,), k=5, gamma_forward=1.0,
                          gamma_reverse=0.1, graph_mode="sum", gamma_reverse_grid=(0.1,)))
  c.num_seeds = 1
  c.num_steps = 40_000
  c.checkpoint_every = 2000
  c.batch_size = 256
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  # program: 'selection' (the class-balanced D2 selection over the 50,000 training embeddings: kNN graph per
  # class, forward and reverse message passing), 'selection_imagenet' (the same over ImageNet-1k's 1,281,167
  # images, 1,000 classes of at most 1,300), 'train' (the ResNet-18 step on the coreset). Embeddings: the
  # 512-wide pooled layer-4 features of the score model (core/model_generator/resnet.py:132-147).
  c.scale = ml_collections.ConfigDict(dict(
      program="selection", programs=("selection", "selection_imagenet", "train"), batch_size=256,
      num_classes=100, class_size=500, imagenet_classes=1000, imagenet_class_size=1300,
      imagenet_points=1_281_167, embedding_dim=512, image_size=32,
      paper_hardware="one GPU (Readme.MD:24,33 --gpuid 0 / 1)", paper_time="not stated in the official code",
      source="adymaharana/d2pruning@bf1ea46 Readme.MD:24,30-38; train.py:25-28,203-205; "
             "core/model_generator/resnet.py:132-147"))
