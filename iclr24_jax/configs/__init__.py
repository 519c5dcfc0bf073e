"""Experiment configs, one module per experiment: `get_config(arg=None) -> ml_collections.ConfigDict`.

They live inside the package so that library code (each experiment's `reproduce()` / `benchmark()`) and an
installed (non-editable) copy can read them: `from iclr24_jax.configs import pmp; pmp.get_config('tiny')`.
Configs depend only on ml_collections and constants: no config imports a paper module. Each parses its `arg` with
`variants.one` (a single variant) or `variants.parse` (comma-separated, with 'at most one of' groups).

The launcher takes a config by path (`--config=configs/pmp.py:tiny`): the top-level `configs/<slug>.py` files are
one-line re-exports of these modules, kept so that the documented commands keep working.
"""
