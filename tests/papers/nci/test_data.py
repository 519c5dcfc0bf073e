"""NCI data (`papers/nci/data.py`): disjoint styled domains and the pretraining pool."""
import numpy as np
import pytest

from iclr24_jax.papers import nci
from iclr24_jax.papers.nci import train as train_lib


def test_domains_are_disjoint_and_styled():
  doms = nci.make_domains(("mnist", "mnist_rot60", "mnist_inv", "digits"), image_size=28)  # 28: no resize
  assert [d.x.shape[1:] for d in doms] == [(28, 28, 1)] * 4
  assert doms[2].x.mean() > 0.6 > doms[0].x.mean()  # inverted: white background
  # Disjoint: the MNIST styles are drawn from disjoint parts of MNIST-5k, so no 'mnist' image comes back when
  # the inversion of 'mnist_inv' is undone (exact pixel match; the same check on 'mnist' itself finds all).
  def keys(x):  # pixel levels k/255 as bytes
    return {np.rint(v * 255).astype(np.uint8).tobytes() for v in x.reshape(len(x), -1)}
  plain, undone = keys(doms[0].x), keys(1.0 - doms[2].x)
  assert len(plain & undone) == 0
  assert len(plain & keys(1.0 - (1.0 - doms[0].x))) == len(plain)  # the check can find a match
  assert len(doms[0].x) + len(doms[1].x) + len(doms[2].x) <= 5000  # parts of the one 5k pool
  with pytest.raises(ValueError, match="unknown domains"):
    nci.make_domains(("svhn",))


def test_config_domains_match_the_data_module():
  # configs import no paper module, so the config spells the domains out; they must stay the data's.
  from iclr24_jax.configs import nci as cfg
  from iclr24_jax.papers.nci import data as nci_data
  assert tuple(cfg.DOMAINS) == tuple(nci_data.DOMAINS)


def _image_keys(x):  # pixel levels k/255 as bytes, one per image
  return [np.rint(v * 255).astype(np.uint8).tobytes() for v in x.reshape(len(x), -1)]


def test_pretraining_pool_is_disjoint_and_covers_every_style():
  from iclr24_jax.configs import nci as cfg
  from iclr24_jax.papers.nci import data as nci_data
  doms = nci.make_domains(nci.DOMAINS, image_size=16, max_per_domain=400)
  pool, rest = nci_data.split_pool(doms, 0.25, seed=0)
  assert [d.name for d in pool] == [n + "_pool" for n in nci.DOMAINS]  # every style, the targets' included
  assert [d.name for d in rest] == list(nci.DOMAINS)
  for dom, p, r in zip(doms, pool, rest):
    assert len(p.y) == 100 and len(r.y) == 300  # round(0.25 * 400)
    assert set(p.y.tolist()) == set(range(10))  # all ten labels in each style's share of the pool
    keys, pk, rk = _image_keys(dom.x), _image_keys(p.x), _image_keys(r.x)
    assert sorted(pk + rk) == sorted(keys)  # a partition of the domain ...
    assert len(set(keys)) == len(keys)  # ... of distinct images (else the next check could not see a leak)
    assert not set(pk) & set(rk)  # ... and disjoint
  # The study's data (sources, the target's adaptation and evaluation splits) never contains a pool image.
  config = cfg.get_config("pretrained")
  config.data.max_per_domain = 400
  pool_keys = {k for p in pool for k in _image_keys(p.x)}
  assert train_lib.pretraining_pool(config)[0].x.shape == pool[0].x.shape
  sources, uda, evl, *_ = train_lib.setup(config, "mnist_rot60", "nci")
  seen = [k for d in sources + [uda, evl] for k in _image_keys(d.x)]
  assert len(seen) == 5 * 300 and not pool_keys & set(seen)
  # Without a pool the study's domains are make_domains' (the from-scratch rows do not change).
  config.data.pool_fraction = 0.0
  np.testing.assert_array_equal(train_lib.study_domains(config)[4].x, doms[4].x)
  with pytest.raises(ValueError, match="pool fraction"):
    nci_data.split_pool(doms, 1.0)
