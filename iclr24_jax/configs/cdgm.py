"""cdgm: Constrained Deep Generative Models for tabular data (Stoian et al., ICLR 2024).

Paper: https://arxiv.org/abs/2402.04823 (https://openreview.net/forum?id=tBROYsEz9G)
Run:  python -m experiments.main --config=configs/cdgm.py:tiny --workdir=runs/cdgm
Variants (after the colon): '' (the embedded generated table, C-TVAE), 'tiny', 'heloc', 'faults' (C-TVAE on the
shared data), 'heloc_official' (C-TVAE on HELOC with the official recipe: 150 epochs = 2,250 steps of 500 rows,
loss factor 2, L2 5e-6), and '<table>_<model>' for table in generated/heloc/faults and model in tvae/ctgan, optionally with
'_unconstrained' or '_postprocessing' appended (e.g. 'heloc_ctgan_unconstrained'), and 'paper' (the official
constrained CTGAN run on Botnet, 757 columns, compiled ahead of time by `python -m experiments.scale --only cdgm`).
"""
import ml_collections

from iclr24_jax.configs import variants

TABLES = ("generated", "heloc", "faults")
MODELS = ("tvae", "ctgan")
VERSIONS = ("constrained", "unconstrained", "postprocessing")


def _model(name: str) -> ml_collections.ConfigDict:
  if name == "tvae":  # official TVAE defaults: 128-dim latent, (128, 128), loss factor 2, batch 500
    return ml_collections.ConfigDict(dict(name="tvae", version="constrained", embedding_dim=128, hidden=(128, 128),
                                          loss_factor=2.0, batch_size=500, pac=1))
  # official CTGAN defaults: 128-dim noise, (256, 256) generator and critic, pac 10, batch 500
  return ml_collections.ConfigDict(dict(name="ctgan", version="constrained", embedding_dim=128, hidden=(256, 256),
                                        loss_factor=0.0, batch_size=500, pac=10))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The cdgm config: C-TVAE on the embedded generated table by default; `arg` picks a table / model / version.

  Args:
    arg: '' (generated table, constrained TVAE), 'tiny', a table ('heloc', 'faults'), 'heloc_official' (the
      official TVAE recipe), '<table>_<model>' (model 'tvae' or 'ctgan'), optionally with '_unconstrained' or
      '_postprocessing' appended, or 'paper' (the official constrained CTGAN on Botnet); None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "cdgm"
  c.seed = 0
  # gmm_fit_rows: fit the per-column Bayesian GMMs on at most this many rows (0 = all rows, the official setting).
  c.data = ml_collections.ConfigDict(dict(name="generated", data_dir="", max_clusters=10, gmm_fit_rows=2000,
                                          gmm_max_iter=100))
  # ordering: 'given' (the file's ordering line), 'random', or 'corr' (the paper's correlation heuristic, computed
  # from an unconstrained model's samples); epsilon: margin for strict inequalities.
  c.constraints = ml_collections.ConfigDict(dict(ordering="given", epsilon=1e-6, schedule="levels"))
  c.model = _model("tvae")
  c.optimizer = ml_collections.ConfigDict(dict(
      name="adam",
      tvae=dict(learning_rate=1e-3, b1=0.9, b2=0.999, weight_decay=1e-5),
      ctgan_g=dict(learning_rate=2e-4, b1=0.5, b2=0.9, weight_decay=1e-6),
      ctgan_d=dict(learning_rate=2e-4, b1=0.5, b2=0.9, weight_decay=1e-6)))
  # The official runs train 300 epochs (HELOC: 15 steps/epoch -> 4,500 steps); the defaults here are smaller.
  c.num_steps = 2000
  c.reproduce_steps = 600        # per model and version in `reproduce(fast=False)`
  c.reproduce_steps_fast = 40
  c.reproduce_seeds = 3          # seeds per comparison (vmapped: one compiled program per model and version)
  # '<table>_<model>' settings of `reproduce`; 'heloc_official' = TVAE with the official recipe (the fair test).
  c.reproduce_settings = ("generated_tvae", "faults_tvae", "heloc_official")
  c.num_samples = 5000
  c.log_every = 100
  c.eval_every = 0
  c.checkpoint_every = 500  # a multiple of log_every (saves happen at the end of a chunk)
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))

  valid = ["", "tiny", "heloc_official", "paper", *TABLES, *[f"{t}_{m}" for t in TABLES for m in MODELS],
           *[f"{t}_{m}_{v}" for t in TABLES for m in MODELS for v in VERSIONS[1:]]]
  arg = variants.one(arg, valid, name="cdgm")
  parts = arg.split("_") if arg else []
  if arg == "tiny":
    c.num_steps = 20
    c.log_every = 10
    c.checkpoint_every = 10
    c.num_samples = 300
    c.data.gmm_fit_rows = 300
    c.data.gmm_max_iter = 20
    c.model.hidden = (32, 32)
    c.model.embedding_dim = 16
    c.model.batch_size = 100
  elif arg in TABLES:
    c.data.name = arg
  elif arg == "paper":
    _paper(c)
  elif arg == "heloc_official":
    # The official HELOC TVAE run: 150 epochs of 15 batches (7,530 rows / 500), loss factor 2, L2 5e-6.
    c.data.name = "heloc"
    c.num_steps = 2250
    c.model.loss_factor = 2.0
    c.optimizer.tvae.weight_decay = 5e-6
  elif arg:  # '<table>_<model>' or '<table>_<model>_<version>'
    c.data.name = parts[0]
    c.model = _model(parts[1])
    if len(parts) == 3:
      c.model.version = parts[2]
  if c.data.name == "faults":
    c.num_samples = 1358  # the size of the training split, as the official evaluation samples |train| rows
  return c


def _paper(c: ml_collections.ConfigDict) -> None:
  """The official constrained CTGAN run on Botnet (mihaela-stoian/ConstrainedDGM@02e5234), for experiments.scale."""
  # example_training_scripts/CTGAN/constrained_botnet.sh:7,10-14,22: 20 epochs, Adam lr 2e-4 for both networks,
  # batch 500, decay 1e-6 for both, pac 1, --version constrained --label_ordering random; main_ctgan.py:49-55
  # (embedding 128, generator and discriminator 256,256). Botnet: 756 features + the label is_botnet
  # (datasets_info.json:16-21: the label, column 756, is the only categorical column).
  c.data.name = "botnet"
  c.data.data_dir = ""
  c.model = _model("ctgan")
  c.model.update(dict(version="constrained", pac=1, batch_size=500))
  c.optimizer.ctgan_g.update(dict(learning_rate=2e-4, weight_decay=1e-6))
  c.optimizer.ctgan_d.update(dict(learning_rate=2e-4, weight_decay=1e-6))
  c.constraints.ordering = "random"
  c.num_epochs = 20
  # Deviation: num_steps stays the library default; the official 20 epochs are ceil(rows / 500) steps each, and
  # the official repository ships no Botnet CSVs to count the rows of (the README points to the paper's appendix).
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  c.scale = ml_collections.ConfigDict(dict(
      batch_size=500, num_features=757, num_classes=2,
      paper_hardware="CPU (constrained_botnet.sh:19-22 run with CUDA_VISIBLE_DEVICES=-1)",
      paper_time="not stated in the official code",
      source="mihaela-stoian/ConstrainedDGM@02e5234 example_training_scripts/CTGAN/constrained_botnet.sh:7,10-14,22; "
             "main_ctgan.py:49-59; datasets_info.json:16-21; data/botnet/botnet_constraints.txt"))
