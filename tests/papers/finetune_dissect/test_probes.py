"""Finetune-dissect probes (`papers/finetune_dissect/probes.py`): the probe set and its filter."""
import math

import numpy as np
import pytest

from iclr24_jax.papers import finetune_dissect as fd


def test_make_probe_set_and_filter():
  docs = ["Is the sky blue? yes, because of scattering.", "Do fish swim? yes, they have fins."]
  seen = []

  def rewriter(prompts):
    seen.extend(prompts)
    tag = lambda p: "CASUAL" if "casual" in p else ("TOPIC" if "different subject" in p else "CF")
    return [f"Sure! Here is the text: \"{tag(p)} {p.splitlines()[-1].upper()}\"" for p in prompts]

  probes = fd.make_probe_set(docs, rewriter)
  assert set(probes) == {"original", "topic", "style", "counterfactual"}
  assert probes["style"][0] == "CASUAL " + docs[0].upper() and len(seen) == 6   # preamble and quotes stripped
  # Embeddings by hand: original e0; style row 0 cos 0.8 (kept), row 1 cos 0.5 (rejected); topic cos 0 (kept).
  e = {docs[0]: [1, 0, 0], docs[1]: [0, 1, 0]}
  rows = {("style", 0): [0.8, 0.6, 0], ("style", 1): [0, 0.5, math.sqrt(0.75)], ("topic", 0): [0, 0, 1],
          ("topic", 1): [0, 0, 1], ("counterfactual", 0): [0.7, 0, math.sqrt(0.51)],
          ("counterfactual", 1): [0, 0.99, math.sqrt(1 - 0.99 ** 2)]}
  table = {probes[v][i]: vec for (v, i), vec in rows.items()}
  table.update(e)
  kept, report = fd.filter_probes(probes, lambda ts: np.array([table[t] for t in ts], float))
  assert kept["style"][0] is not None and kept["style"][1] is None
  assert kept["topic"] == probes["topic"]
  assert kept["counterfactual"][0] is not None and kept["counterfactual"][1] is None   # 0.99 > 0.95: a copy
  assert report["style"]["accepted"] == 1 and report["style"]["rate"] == 0.5
  with pytest.raises(ValueError, match="empty"):
    fd.make_probe_set(["ok", " "], rewriter)
  with pytest.raises(ValueError, match="answers"):
    fd.make_probe_set(docs, lambda ps: ps[:1])
