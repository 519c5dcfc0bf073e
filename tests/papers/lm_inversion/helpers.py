"""Shared by the lm_inversion test modules: the skip marker of the tests that read the shared data."""
import pytest

from iclr24_jax.common import data as data_lib


needs_data = pytest.mark.skipif(data_lib.shared_data_dir() is None,
                                reason="../shared/data (or $ICLR24_DATA) is absent: the prompts come from it")
