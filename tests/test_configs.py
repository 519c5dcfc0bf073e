"""Every packaged config builds its default and 'tiny' variants and names itself in a bad-variant error; the shared
variant parser (iclr24_jax/configs/variants.py) accepts and rejects what it documents."""
import ast
import importlib
import pathlib
import pkgutil

import ml_collections
import pytest

import iclr24_jax.configs as configs_pkg
from iclr24_jax.configs import variants

CONFIG_DIR = pathlib.Path(configs_pkg.__file__).parent
SLUGS = sorted(m.name for m in pkgutil.iter_modules([str(CONFIG_DIR)]) if m.name != "variants")


def test_every_config_module_is_listed():
  # 23 configs today; a new config file is picked up without editing this test.
  assert len(SLUGS) >= 23 and {"pmp", "mdm", "mario", "cdgm", "unio4"} <= set(SLUGS)


@pytest.mark.parametrize("slug", SLUGS)
def test_default_and_tiny_build(slug):
  mod = importlib.import_module(f"iclr24_jax.configs.{slug}")
  default, none, tiny = mod.get_config(""), mod.get_config(None), mod.get_config("tiny")
  for c in (default, none, tiny):
    assert isinstance(c, ml_collections.ConfigDict)
    assert c.paper == slug
  assert default.to_json(sort_keys=True) == none.to_json(sort_keys=True)   # None and '' are the same default
  assert tiny.to_json(sort_keys=True) != default.to_json(sort_keys=True)   # 'tiny' changes something


@pytest.mark.parametrize("slug", SLUGS)
def test_bad_variant_names_the_file_and_the_part(slug):
  mod = importlib.import_module(f"iclr24_jax.configs.{slug}")
  with pytest.raises(ValueError, match=rf"configs/{slug}\.py") as e:
    mod.get_config("no_such_variant_xyz")
  assert "no_such_variant_xyz" in str(e.value) and "tiny" in str(e.value)   # the bad part and the choices


@pytest.mark.parametrize("slug", SLUGS)
def test_configs_import_nothing_from_papers(slug):
  tree = ast.parse((CONFIG_DIR / f"{slug}.py").read_text())
  names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
  names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
  assert not [m for m in names if m.startswith("iclr24_jax.papers")], names


def test_parse_keeps_order_strips_and_drops_empty_parts():
  assert variants.parse(None, ("a", "b"), name="x") == []
  assert variants.parse("", ("a", "b"), name="x") == []
  assert variants.parse("b,,a, b ", ("a", "b"), name="x") == ["b", "a", "b"]


def test_parse_key_value_choices():
  assert variants.parse("alpha=0.3,tiny", ("tiny", "alpha=<a>"), name="x") == ["alpha=0.3", "tiny"]
  with pytest.raises(ValueError, match="'alphas=1'"):
    variants.parse("alphas=1", ("tiny", "alpha=<a>"), name="x")


def test_parse_errors_name_file_parts_and_choices():
  with pytest.raises(ValueError, match=r"unknown variant 'tiny,zz,yy' for configs/demo\.py \(unknown 'zz', 'yy'\); "
                                       r"choose from \['tiny', 'p2'\]"):
    variants.parse("tiny,zz,yy", ("", "tiny", "p2"), name="demo")
  # exclusive groups: at most one of each group; such a config reports 'unknown or conflicting'
  arms = ("progressive", "nested", "single")
  assert variants.parse("tiny,nested", ("tiny",) + arms, name="demo", exclusive=(arms,)) == ["tiny", "nested"]
  with pytest.raises(ValueError, match=r"unknown or conflicting variant .*at most one of 'nested', 'single'"):
    variants.parse("tiny,nested,single", ("tiny",) + arms, name="demo", exclusive=(arms,))
  with pytest.raises(ValueError, match=r"unknown or conflicting variant 'zz' for configs/demo\.py"):
    variants.parse("zz", ("tiny",) + arms, name="demo", exclusive=(arms,))


def test_one_takes_a_single_variant():
  assert variants.one(None, ("", "tiny"), name="demo") == ""
  assert variants.one("tiny", ("tiny",), name="demo") == "tiny"
  # a comma is no separator for a one-variant config
  with pytest.raises(ValueError,
                     match=r"unknown variant 'tiny,tiny' for configs/demo\.py; choose one of \['', 'tiny'\]"):
    variants.one("tiny,tiny", ("tiny",), name="demo")


def test_unknown_variant_is_named():
  from iclr24_jax.configs import classify
  with pytest.raises(ValueError, match="unknown variant 'huge'"):
    classify.get_config("huge")
