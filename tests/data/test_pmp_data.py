"""pmp.data.load on a YelpChi.mat written with the CARE-GNN keys (scipy.io.savemat, sparse features and relations)."""
import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from iclr24_jax.common import data as common_data
from iclr24_jax.papers.pmp import data as pmp_data


def _write_yelpchi(path, n=20):
  rng = np.random.default_rng(0)
  feats = sp.csc_matrix(rng.integers(0, 3, (n, 4)).astype(np.float64))   # CARE-GNN stores features sparse
  label = np.zeros((1, n))                                               # and the label as [1, N]
  label[0, [3, 7, 11]] = 1
  rel = lambda pairs: sp.csc_matrix((np.ones(len(pairs)), tuple(np.asarray(pairs).T)), shape=(n, n))
  rels = {"net_rur": rel([(0, 1), (1, 0), (2, 2)]),                     # (2, 2) is a self-loop
          "net_rtr": rel([(0, 3), (3, 0), (4, 5)]), "net_rsr": rel([(5, 6)])}
  scipy.io.savemat(path / "YelpChi.mat", {"features": feats, "label": label, "homo": rel([(0, 1)]), **rels})
  return feats.toarray(), label.ravel()


def test_yelpchi_official_preprocessing(tmp_path):
  x, y = _write_yelpchi(tmp_path)
  g = pmp_data.load({"name": "yelpchi", "data_dir": str(tmp_path)})
  assert g.x.shape == (20, 4) and g.x.dtype == np.float32 and g.labels.dtype == np.int32
  # official row_normalize: x / (row sum + 0.01), e.g. row 0
  np.testing.assert_allclose(g.x[0], x[0] / (x[0].sum() + 0.01), rtol=1e-6)
  np.testing.assert_array_equal(g.labels, y.astype(np.int32))
  assert set(np.unique(g.labels)) <= {0, 1} and g.relation_names == ("net_rsr", "net_rtr", "net_rur")
  assert [len(s) for s, _ in g.relations] == [1, 3, 2]                   # the self-loop (2, 2) is dropped
  # DGL split of N = 20: train int(0.4 * 20) = 8, val int(0.2 * 20) = 4, test the 8 left; disjoint and complete
  assert (len(g.train_idx), len(g.val_idx), len(g.test_idx)) == (8, 4, 8)
  assert len(set(g.train_idx) | set(g.val_idx) | set(g.test_idx)) == 20
  assert set(pmp_data.DATASETS) >= {"yelpchi", "amazon", "tfinance"}


def test_missing_and_malformed_mat(tmp_path):
  with pytest.raises(common_data.DataNotFoundError, match="CARE-GNN"):
    pmp_data.load({"name": "amazon", "data_dir": str(tmp_path)})
  with pytest.raises(common_data.DataNotFoundError, match="data_dir"):
    pmp_data.load({"name": "yelpchi", "data_dir": ""})
  scipy.io.savemat(tmp_path / "YelpChi.mat", {"features": np.ones((3, 2)), "label": np.zeros((1, 3))})
  with pytest.raises(common_data.DataFormatError, match="net_rsr"):
    pmp_data.load({"name": "yelpchi", "data_dir": str(tmp_path)})
  with pytest.raises(ValueError, match="unknown PMP data set"):
    pmp_data.load({"name": "cora", "data_dir": str(tmp_path)})
