"""Finetune-dissect study (`papers/finetune_dissect/study.py`): the base-fit and prior-shift rows."""
import math

import numpy as np

from iclr24_jax.configs import finetune_dissect as cfg_mod
from iclr24_jax.papers.finetune_dissect import finetune as ft
from iclr24_jax.papers.finetune_dissect import grammar
from .helpers import SMALL


def test_base_fit_row_checks_every_seed():
  from iclr24_jax.papers.finetune_dissect import study
  ent = grammar.general_entropy(SMALL)
  good = {k: np.full(3, ent[k] + 0.01) for k in ("per_token", *ft.FIT_SLOTS)}
  row = study.base_fit_row({"base_fit": good, "entropy": ent, "spec": SMALL}, "x")
  assert row["kind"] == "check" and row["holds"] == "yes"
  # One seed that ignores the context: its later topic words cost ln(T V_t) = ln 12.
  bad = dict(good, later_topic=np.array([ent["later_topic"], ent["later_topic"], math.log(12)]))
  assert study.base_fit_row({"base_fit": bad, "entropy": ent, "spec": SMALL}, "x")["holds"] == "no"


def test_prior_shift_row_against_the_closed_form():
  from iclr24_jax.papers.finetune_dissect import study
  spec = ft.spec_from_config(cfg_mod.get_config("").data)   # p = 0.8, 4 topics, 3 styles
  # Closed form: topic ln(0.8 * 3 / 0.2) = ln 12 = 2.4849; style ln(0.8 * 2 / 0.2) = ln 8 = 2.0794.
  bp = {k: np.zeros((3, spec.seq_len)) for k in ("topic", "style", "factual")}
  bp["topic"][:, 2] = math.log(12) + np.array([0.05, -0.05, 0.0])    # slot order: BOS, style, topic, ...
  bp["style"][:, 1] = math.log(8)
  fake = {"spec": spec, "methods": {"full": {"by_position": bp}}}
  row = study.prior_shift_row(fake, "x")
  assert row["kind"] == "check" and row["holds"] == "yes" and "max |error| 0.050" in row["notes"]
  bp["style"][1, 1] = math.log(8) - 0.2     # one seed short of the closed form by 0.2 nats
  assert study.prior_shift_row(fake, "x")["holds"] == "no"
