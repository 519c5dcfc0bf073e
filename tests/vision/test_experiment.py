"""The classify experiment (`iclr24_jax.vision.experiment`) trains the digits CNN to its accuracy."""


def test_digits_cnn_reaches_95_percent(tmp_path):
  from iclr24_jax.configs import classify as cfg
  from iclr24_jax.vision import experiment
  res = experiment.run(cfg.get_config(""), str(tmp_path))
  assert res["test_accuracy"] >= 0.95
