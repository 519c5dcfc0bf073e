"""Supervised digit classification: the foundation's end-to-end check.

Run:  python -m experiments.main --config=configs/classify.py:tiny --workdir=runs/classify
Variants (after the colon): '' (digits CNN, the default), 'tiny', 'mnist5k', 'resnet'.
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "tiny", "mnist5k", "resnet")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The classify config: a digits CNN (1,500 Adam steps, cosine schedule) unless `arg` picks a variant.

  Args:
    arg: '' (digits CNN), 'tiny' (40 steps of a smaller CNN), 'mnist5k' (MNIST-5k, 2,000 steps) or 'resnet'
      (a width-16 ResNet-18 with group norm); None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "classify"
  c.seed = 0
  c.data = ml_collections.ConfigDict(dict(name="digits", data_dir=""))
  c.model = ml_collections.ConfigDict(dict(name="cnn", features=(32, 64), dense=128, dropout=0.0))
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=1e-3, schedule="cosine",
                                               warmup_steps=50, weight_decay=0.0, grad_clip=0.0))
  c.num_steps = 1500
  c.batch_size = 64
  c.log_every = 50
  c.eval_every = 500
  c.checkpoint_every = 500
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  arg = variants.one(arg, VARIANTS, name="classify")
  if arg == "tiny":
    c.num_steps = 40
    c.batch_size = 32
    c.log_every = 10
    c.eval_every = 20
    c.checkpoint_every = 20
    c.optimizer.warmup_steps = 0
    c.optimizer.schedule = "constant"
    c.optimizer.learning_rate = 1e-2
    c.model.features = (8, 16)
    c.model.dense = 32
  elif arg == "mnist5k":
    c.data.name = "mnist5k"
    c.num_steps = 2000
  elif arg == "resnet":
    c.model = ml_collections.ConfigDict(dict(name="resnet18", width=16, norm="group", stage_sizes=(2, 2, 2, 2)))
  return c
