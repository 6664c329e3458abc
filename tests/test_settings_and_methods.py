"""Tests of RoutingSettings validation and of the named methods (paper B.1)."""

import json

import pytest

from fedroute.core.settings import RoutingSettings
from fedroute.core.methods import method_settings


@pytest.mark.parametrize("changes, field", [
    (dict(num_clusters=0), "num_clusters"),
    (dict(num_clusters=-2), "num_clusters"),
    (dict(controllers=()), "controllers"),
    (dict(controllers=("gr", "xyz")), "controllers"),
    (dict(controllers=("gr", "gr")), "controllers"),
    (dict(exp3_mode="blocks"), "exp3_mode"),
    (dict(block_length=0), "block_length"),
    (dict(exp3_learning_rate=0.0), "exp3_learning_rate"),
    (dict(exp3_learning_rate=-1.0), "exp3_learning_rate"),
    (dict(exp3_exploration=-0.01), "exp3_exploration"),
    (dict(exp3_exploration=1.01), "exp3_exploration"),
    (dict(rank_hedge_temperature=-0.1), "rank_hedge_temperature"),
    (dict(commitment_margin=1.0), "commitment_margin"),
    (dict(commitment_margin=-0.1), "commitment_margin"),
    (dict(reversal_mass_threshold=1.5), "reversal_mass_threshold"),
    (dict(reversal_mass_threshold=-0.1), "reversal_mass_threshold"),
    (dict(entry_threshold=-1.5), "entry_threshold"),
    (dict(entry_threshold=1.01), "entry_threshold"),
    (dict(hysteresis_min_rounds=0), "hysteresis_min_rounds"),
    (dict(hysteresis_exit_gap=-0.001), "hysteresis_exit_gap"),
    (dict(hysteresis_min_rounds=5, hysteresis_max_rounds=4), "hysteresis_max_rounds"),
    (dict(num_clusters=1, synchronized_entry=True, controllers=("gr",)), "num_clusters"),
    (dict(num_clusters=1, controllers=("gr", "hys")), "num_clusters"),
])
def test_rejects_bad_values_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=f"'{field}'"):
        RoutingSettings(**changes)


def test_accepts_boundary_values():
    settings = RoutingSettings(num_clusters=1, controllers=("gr",), block_length=1, exp3_exploration=1.0,
                               commitment_margin=0.0, reversal_mass_threshold=1.0, entry_threshold=-1.0,
                               hysteresis_min_rounds=3, hysteresis_max_rounds=3, hysteresis_exit_gap=0.0)
    assert settings.num_arms == 1 and not settings.selects_controllers


def test_integer_fields_reject_non_integers():
    """The fields are documented as integers ("an integer ≥ 1"); 2.5 must not be accepted.

    block_length = 2.5 would otherwise silently disable every EXP3 update
    (``t % 2.5 == 1.5`` never holds for an integer round).
    """
    accepted = []
    for field in ("num_clusters", "block_length", "hysteresis_min_rounds", "hysteresis_max_rounds"):
        try:
            RoutingSettings(**{field: 7.5})
        except ValueError:
            continue
        accepted.append(field)
    assert accepted == [], f"non-integer values accepted for {accepted}"


def test_controllers_list_becomes_tuple_and_properties():
    settings = RoutingSettings(controllers=["gr", "com", "rev"])
    assert settings.controllers == ("gr", "com", "rev")
    assert settings.num_arms == 3 and settings.selects_controllers


def test_to_dict_from_dict_round_trip():
    settings = RoutingSettings(num_clusters=3, controllers=("gr", "hys"), exp3_mode="action", block_length=4,
                               exp3_learning_rate=1.5, exp3_exploration=0.01, rank_hedge_temperature=0.3,
                               commitment_margin=0.1, reversal_mass_threshold=0.25, entry_threshold=-0.2,
                               hysteresis_min_rounds=2, hysteresis_exit_gap=0.01, hysteresis_max_rounds=50,
                               synchronized_entry=True)
    values = settings.to_dict()
    assert values["controllers"] == "gr,hys"
    assert json.loads(json.dumps(values)) == values  # plain JSON
    assert RoutingSettings.from_dict(values) == settings
    assert RoutingSettings.from_dict(json.loads(json.dumps(values))) == settings


def test_from_dict_parses_spaces_and_rejects_unknown_keys():
    assert RoutingSettings.from_dict({"controllers": " gr , rh "}).controllers == ("gr", "rh")
    with pytest.raises(ValueError, match="bogus"):
        RoutingSettings.from_dict({"bogus": 1})


# ----------------------------------------------------------------- methods --
def test_greedy_method():
    settings = method_settings("greedy", preset="linear")
    assert settings.controllers == ("gr",)
    assert not settings.synchronized_entry
    # Greedy is Greedy whatever controller set is passed.
    assert method_settings("greedy", preset="housing", controllers=("gr", "rev")).controllers == ("gr",)


def test_exp3_on_linear_is_block_over_gr_rh():
    settings = method_settings("exp3", preset="linear")
    assert settings.controllers == ("gr", "rh")
    assert settings.exp3_mode == "block"
    assert settings.block_length == 10 and settings.exp3_learning_rate == 2.0
    assert settings.exp3_exploration == 0.001 and settings.rank_hedge_temperature == 0.0
    assert not settings.synchronized_entry
    assert settings.hysteresis_max_rounds == 160


def test_exp3_on_other_tasks():
    assert method_settings("exp3", preset="gmm").controllers == ("gr", "rh")
    housing = method_settings("exp3", preset="housing")
    assert housing.controllers == ("gr", "com", "rev") and housing.exp3_mode == "block"
    assert housing.commitment_margin == 0.05
    characters = method_settings("exp3", preset="characters")
    assert characters.controllers == ("gr", "hys") and characters.exp3_mode == "action"
    assert characters.hysteresis_max_rounds == 160 and characters.hysteresis_min_rounds == 5
    assert characters.hysteresis_exit_gap == 0.005


def test_sync_entry_method():
    settings = method_settings("sync-entry", preset="characters")
    assert settings.controllers == ("gr", "hys")
    assert settings.exp3_mode == "action"
    assert settings.synchronized_entry
    assert settings.hysteresis_max_rounds == 800
    assert settings.reversal_mass_threshold == 0.20
    assert method_settings("sync-entry", preset="linear").synchronized_entry


def test_method_overrides_and_none_means_default():
    assert method_settings("exp3", preset="linear", block_length=None).block_length == 10
    assert method_settings("exp3", preset="linear", block_length=5).block_length == 5
    with pytest.raises(ValueError, match="'block_length'"):
        method_settings("exp3", preset="linear", block_length=0)


def test_unknown_method_or_task_raises():
    with pytest.raises(ValueError, match="method"):
        method_settings("ifca", preset="linear")
    with pytest.raises(ValueError, match="task"):
        method_settings("greedy", preset="mnist")
