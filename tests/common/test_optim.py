"""common.optim: frozen settings are hashable, order-independent and thaw back to the same settings."""
import ml_collections

from iclr24_jax.common import optim


def test_freeze_thaw_round_trip_and_order_independence():
  cfg = ml_collections.ConfigDict({"name": "adam", "learning_rate": 3e-4, "sizes": [64, 64],
                                   "inner": {"b": 2, "a": 1}, "empty": {}})
  frozen = optim.freeze(cfg)
  hash(frozen)
  # Keys sorted at every level; the list became a tuple.
  assert frozen == (("empty", ()), ("inner", (("a", 1), ("b", 2))), ("learning_rate", 3e-4), ("name", "adam"),
                    ("sizes", (64, 64)))
  assert optim.freeze({"sizes": (64, 64), "name": "adam", "inner": {"a": 1, "b": 2}, "learning_rate": 3e-4,
                       "empty": {}}) == frozen
  # An empty mapping freezes to () and thaws to (): the one shape the inverse cannot tell apart.
  assert optim.thaw(frozen) == {"empty": (), "inner": {"a": 1, "b": 2}, "learning_rate": 3e-4, "name": "adam",
                                "sizes": (64, 64)}
  assert optim.freeze(optim.thaw(frozen)) == frozen
  assert optim.thaw(5) == 5 and optim.thaw((1, 2)) == (1, 2)
