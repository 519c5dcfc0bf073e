"""Finetune-dissect experiment (`papers/finetune_dissect/experiment.py`): the tiny run, once: full and LoRA
finetuning learn, the base reads the context, results and plots."""
import json
import math
import os

import numpy as np
import pytest

from iclr24_jax.configs import finetune_dissect as cfg_mod
from iclr24_jax.papers.finetune_dissect import finetune as ft
from iclr24_jax.papers.finetune_dissect import grammar
from .helpers import SMALL, _assert_base_models_grammar


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  from iclr24_jax.papers.finetune_dissect import experiment
  workdir = str(tmp_path_factory.mktemp("finetune_dissect_tiny"))
  return workdir, experiment.run(cfg_mod.get_config("tiny"), workdir)


def test_full_and_lora_finetuning_learn(tiny_run):
  # The tiny run pretrains 2 seeds, then finetunes fully and with rank-2 LoRA adapters (one program each).
  _, res = tiny_run
  assert set(res["methods"]) == {"full", "lora2"}
  for m, r in res["methods"].items():
    # Finetuning on the domain raises the likelihood of fixed domain texts (the probes' originals; per token, every
    # seed): the loss on a fixed batch goes down.
    assert np.all(np.array(r["total"])[:, -1] > 0.0), m
  # Full finetuning also lowers the training loss (mean of the last 10 steps vs the first 10); rank-2 LoRA at this
  # learning rate moves it by less than the minibatch noise in 20 steps (its fixed-batch change above is positive).
  full = res["methods"]["full"]
  assert np.all(np.array(full["final_loss"]) < np.array(full["first_loss"]))
  with pytest.raises(ValueError, match="lora<rank>"):
    ft.method_lora("qlora", cfg_mod.get_config("tiny").lora)


def test_experiment_tiny(tiny_run):
  workdir, res = tiny_run
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert len(saved["methods"]["full"]["topic"]) == 2 and len(saved["methods"]["full"]["topic"][0]) == 2
  assert all(os.path.exists(p) for p in res["plots"])
  assert os.path.exists(os.path.join(workdir, "metrics.jsonl"))
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("huge")


def test_tiny_pretraining_learns_to_read_the_context(tiny_run):
  # The tiny config's base (1 layer, 4 heads, 600 steps on 6-sentence documents; 2 seeds) on fresh 3-sentence
  # documents. Without the context a later topic word costs ln(3 * 4) = 2.485 nats instead of ln 4 = 1.386, a style
  # word ln(2 * 3) = 1.792 instead of ln 3 = 1.099.
  _, res = tiny_run
  ent = grammar.general_entropy(SMALL)
  assert res["entropy"]["per_token"] == pytest.approx(ent["per_token"])
  assert ent["later_topic"] == pytest.approx(math.log(4)) and ent["first_topic"] == pytest.approx(math.log(12))
  assert len(res["base_fit"]["per_token"]) == 2
  _assert_base_models_grammar(res["base_fit"], ent)
