"""CPM's data (`papers/cpm/data.py`): the HH-RLHF pairs from the shared data."""
import numpy as np

from iclr24_jax.papers import cpm


def test_hh_pairs(shared_data):
  pairs = cpm.load_pairs(50, seed=0, max_chars=600, data_dir=str(shared_data))
  assert len(pairs) == 50 and len({p["index"] for p in pairs}) == 50
  assert all(p["reply_a"] != p["reply_b"] and p["history"].startswith("Human:") for p in pairs)
  labels = np.array([p["label"] for p in pairs])
  assert 10 < labels.sum() < 40                       # a fair coin puts the chosen reply first
  more = cpm.load_pairs(10, seed=0, max_chars=600, data_dir=str(shared_data), skip=50)
  assert not {p["index"] for p in more} & {p["index"] for p in pairs}
