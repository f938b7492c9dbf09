import math

import pytest

from chat.errors import SettingsError
from chat.sampling import KNOB_NAMES, KNOBS, SamplingRules


def test_defaults_come_from_the_table():
    defaults = SamplingRules().defaults
    assert defaults.as_dict() == {knob.name: knob.default for knob in KNOBS}


def test_every_knob_explains_itself_in_one_line():
    for knob in KNOBS:
        assert knob.help.endswith(".") and "\n" not in knob.help and len(knob.help) < 140


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"temperature": 5}, "Temperature must be a number from 0 to 2; it was 5."),
        ({"temperature": -0.1}, "Temperature must be a number from 0 to 2; it was -0.1."),
        ({"top_p": 0}, "Top-p must be a number from 0.05 to 1; it was 0."),
        ({"max_tokens": 0}, "Max new tokens must be a whole number from 1 to 4096; it was 0."),
        ({"max_tokens": 12.5}, "Max new tokens must be a whole number from 1 to 4096; it was 12.5."),
        ({"top_k": "many"}, "Top-k must be a whole number from 0 to 200; it was 'many'."),
        ({"temperature": True}, "Temperature must be a number from 0 to 2; it was True."),
        ({"temperature": math.nan}, "Temperature must be a number from 0 to 2; it was nan."),
        ({"temprature": 1}, "Unknown setting 'temprature'; the settings are " + ", ".join(KNOB_NAMES) + "."),
    ],
)
def test_out_of_range_values_give_one_plain_sentence(values, message):
    with pytest.raises(SettingsError) as caught:
        SamplingRules().resolve(values)
    assert caught.value.message == message


def test_sliders_send_floats_for_whole_numbers():
    sampling = SamplingRules().resolve({"max_tokens": 64.0, "top_k": 40.0, "seed": 7.0})
    assert (sampling.max_tokens, sampling.top_k, sampling.seed) == (64, 40, 7)
    assert isinstance(sampling.max_tokens, int)


def test_a_preset_narrows_ranges_and_values_are_checked_against_them():
    rules = SamplingRules().narrowed({"max_tokens": (128, None, 512), "temperature": (0.0, None, None)})
    assert rules.defaults.max_tokens == 128 and rules.defaults.temperature == 0.0
    assert rules.knob("max_tokens").maximum == 512
    with pytest.raises(SettingsError, match="from 1 to 512; it was 1000"):
        rules.resolve({"max_tokens": 1000})


def test_a_preset_cannot_widen_a_range_beyond_what_the_engine_accepts():
    with pytest.raises(SettingsError, match="Temperature must be a number from 0 to 2; it was 3"):
        SamplingRules().narrowed({"temperature": (None, None, 3)})


def test_settings_a_person_changed_survive_a_preset_switch_where_they_fit():
    from chat.sampling import SamplingRules

    creative = SamplingRules().narrowed({"temperature": (0.7, None, None), "max_tokens": (256, None, 1024)})
    terse = SamplingRules().narrowed({"temperature": (0.0, 0.0, 1.0), "max_tokens": (24, None, 512)})
    values = {"temperature": 1.2, "top_p": 0.5, "max_tokens": 256, "seed": -1}  # changed: temperature, top_p
    kept, notes = terse.carried_over(creative, values, "Terse")
    assert kept["top_p"] == 0.5  # changed, and it fits
    assert kept["max_tokens"] == 24  # left alone: the new preset's default
    assert kept["temperature"] == 1.0  # changed, too high here: the most it allows, and a sentence says so
    assert notes == ["Temperature 1.2 is outside what Terse allows, so it is now 1, the most it allows."]
    assert creative.carried_over(terse, {"temperature": 0.4}, "Creative") == (
        {**{k.name: k.kind(k.default) for k in creative.knobs}, "temperature": 0.4}, [])
