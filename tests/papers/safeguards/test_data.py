"""Safeguards data (`papers/safeguards/data.py`): the synthetic generator and the digit concepts."""
import chex
import numpy as np

from iclr24_jax.papers import safeguards as sg


def test_synthetic_generator_matches_its_definition():
  ds = sg.make_synthetic(num_samples=20000, seed=0, concept_noise=(0.0, 0.3, 1.0))
  assert (len(ds.train), len(ds.val), len(ds.test)) == (12000, 4000, 4000)
  chex.assert_shape((ds.train.x, ds.train.c), [(12000, 5), (12000, 3)])
  x, c = ds.train.x, ds.train.c
  np.testing.assert_array_equal(c[:, 0], x[:, [0, 1, 3]].sum(1) % 2)          # noise 0: exact parity
  np.testing.assert_allclose(x.mean(), 0.7, atol=0.01)
  np.testing.assert_allclose(ds.train.c_prob[:, 2], 0.5)                      # noise 1: a fair coin
  expected = ds.train.c_prob[:, 1]
  assert abs(c[:, 1].mean() - expected.mean()) < 4 * np.sqrt(0.25 / len(c))
  logit = c @ np.array([1.0, 2.0, 3.0]) - 2.0
  assert abs(ds.train.y.mean() - np.mean(1 / (1 + np.exp(-logit)))) < 4 * np.sqrt(0.25 / len(c))


def test_digit_concepts_on_drawn_images():
  img = np.zeros((2, 8, 8), np.float32)
  img[0, 0:3, 2:5] = 1.0          # a ring in rows 0-2 around pixel (1, 3): a top loop
  img[0, 1, 3] = 0.0
  img[0, 0:8, 6] = 1.0            # a full vertical stroke in column 6
  img[1, 7, 0:5] = 1.0            # a bottom bar, ink low and left
  c = sg.digit_concepts(img)
  names = [n for n, _ in sg.data.DIGITS_CONCEPTS]
  got = [dict(zip(names, row)) for row in c]
  assert got[0]["loop_top"] == 1 and got[0]["loop_bottom"] == 0 and got[0]["stroke_right"] == 1
  assert got[0]["stroke_left"] == 0 and got[0]["bar_top"] == 0
  assert got[1]["bar_bottom"] == 1 and got[1]["ink_low"] == 1 and got[1]["ink_left"] == 1
  assert got[1]["loop_top"] == 0 and got[1]["stroke_right"] == 0
  ds = sg.make_digits_concepts()
  chex.assert_shape(ds.train.c, (len(ds.train), 8))
  assert 0.2 < ds.train.c.mean() < 0.8 and set(np.unique(ds.train.y)) == {0, 1}
