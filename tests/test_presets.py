"""Preset files: every mistake is reported precisely, and one bad file never hides the good ones."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from chat.errors import PresetError
from chat.presets import DEFAULT_PRESETS_DIR, load_preset, load_presets
from chat.sampling import SamplingRules
from tests.conftest import app_command, finished, without_vllm

USES_VLLM = True  # engine settings are checked against vLLM's AsyncEngineArgs (tests/conftest.py: the engine tier)

GOOD = """\
name: Tiny
description: A tiny test preset.
model: embedded
engine:
  max_model_len: 1024
  kv_cache_memory_bytes: 268435456
sampling:
  temperature: 0.2
  max_tokens: {default: 64, max: 512}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(PresetError) as caught:
        load_preset(path)
    return caught.value.message.replace(str(path.parent) + "/", "")


def test_a_good_preset_loads_with_its_ranges(tmp_path):
    preset = load_preset(write(tmp_path, "tiny.yaml", GOOD))
    assert preset.name == "Tiny" and preset.model_kind == "embedded"
    assert preset.sampling.defaults.temperature == 0.2
    assert preset.sampling.knob("max_tokens").maximum == 512
    assert preset.engine == {"max_model_len": 1024, "kv_cache_memory_bytes": 268435456}


def test_without_the_engine_check_its_keys_are_left_to_vllm_s_start(tmp_path):
    """What only reads presets (the unit tests of the page) need not import vLLM; the app checks them."""
    path = write(tmp_path, "qwen.yaml", GOOD.replace("max_model_len: 1024", "max_num_seq: 8"))
    assert load_preset(path, check_engine=False).engine == {"max_num_seq": 8, "kv_cache_memory_bytes": 268435456}
    assert error_of(path).endswith("unknown engine key 'max_num_seq' - did you mean 'max_num_seqs'?")
    assert "qwen" in load_presets(tmp_path).problems and "Tiny" in load_presets(tmp_path, check_engine=False).presets


def test_unknown_engine_key_suggests_the_closest_valid_one(tmp_path):
    path = write(tmp_path, "qwen.yaml", GOOD.replace("max_model_len: 1024", "max_num_seq: 8"))
    assert error_of(path) == "qwen.yaml, line 5: unknown engine key 'max_num_seq' - did you mean 'max_num_seqs'?"


def test_engine_value_of_the_wrong_type(tmp_path):
    path = write(tmp_path, "bad.yaml", GOOD.replace("max_model_len: 1024", "max_model_len: lots"))
    assert error_of(path).startswith("bad.yaml, line 5: engine.max_model_len must be a whole number; it is 'lots'")


def test_unknown_top_level_key_suggests_the_closest_valid_one(tmp_path):
    path = write(tmp_path, "typo.yaml", GOOD.replace("description:", "descripton:"))
    assert error_of(path) == "typo.yaml, line 2: unknown key 'descripton' - did you mean 'description'?"


def test_a_missing_required_key(tmp_path):
    path = write(tmp_path, "nomodel.yaml", GOOD.replace("model: embedded\n", ""))
    assert error_of(path) == "nomodel.yaml: the key 'model' is required."


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    path = write(tmp_path, "broken.yaml", GOOD + "sampling: [unclosed\n")
    assert error_of(path).startswith("broken.yaml, line 11: this is not valid YAML")


def test_a_missing_model_folder(tmp_path):
    path = write(tmp_path, "local.yaml", GOOD.replace("model: embedded", "model: ./models/nowhere"))
    message = error_of(path)
    assert message.startswith("local.yaml, line 3: the model folder ./models/nowhere does not exist (looked in ")


def test_an_unknown_sampling_setting(tmp_path):
    path = write(tmp_path, "samp.yaml", GOOD.replace("temperature: 0.2", "temprature: 0.2"))
    assert error_of(path) == "samp.yaml, line 8: unknown sampling setting 'temprature' - did you mean 'temperature'?"


def test_a_sampling_default_outside_what_the_engine_accepts(tmp_path):
    path = write(tmp_path, "hot.yaml", GOOD.replace("temperature: 0.2", "temperature: 4"))
    assert error_of(path) == "hot.yaml, line 8: sampling.temperature: Temperature must be a number from 0 to 2; it was 4.0."


MANY_MISTAKES = """\
name: Many
descripton: Every kind of mistake at once.
model: not a repo
hardware: {device: tpu, gpus: 1}
engine:
  max_model_len: lots
  max_num_seq: 8
sampling:
  temprature: 0.2
  top_p: 7
  max_tokens: {default: 64, mx: 512}
timeout_s: -1
"""


def test_every_problem_of_a_file_is_reported_at_once_in_line_order(tmp_path):
    path = write(tmp_path, "many.yaml", MANY_MISTAKES)
    top_p = SamplingRules().knob("top_p")
    assert error_of(path).splitlines() == [
        "many.yaml, line 2: unknown key 'descripton' - did you mean 'description'?",
        "many.yaml, line 3: model 'not a repo' is neither 'embedded', a folder (start it with ./ or /) nor a Hugging Face "
        "repo id like Qwen/Qwen2.5-7B-Instruct.",
        "many.yaml, line 4: hardware.device: input should be 'cpu' or 'gpu'; it is 'tpu'.",
        "many.yaml, line 6: engine.max_model_len must be a whole number; it is 'lots' (input should be a valid integer).",
        "many.yaml, line 7: unknown engine key 'max_num_seq' - did you mean 'max_num_seqs'?",
        "many.yaml, line 9: unknown sampling setting 'temprature' - did you mean 'temperature'?",
        f"many.yaml, line 10: sampling.top_p: Top-p must be a number from {top_p.format(top_p.minimum)} to 1; it was 7.0.",
        "many.yaml, line 11: unknown key 'sampling.max_tokens.mx' - did you mean 'max'?",
        "many.yaml, line 12: timeout_s: input should be greater than 0; it is -1.",
    ]


def test_a_value_that_may_be_a_number_or_a_range_is_judged_by_the_form_used(tmp_path):
    as_number = write(tmp_path, "a.yaml", GOOD.replace("temperature: 0.2", "temperature: hot"))
    assert error_of(as_number) == "a.yaml, line 8: sampling.temperature: input should be a valid number; it is 'hot'."
    as_range = write(tmp_path, "b.yaml", GOOD.replace("max: 512", "max: lots"))
    assert error_of(as_range) == "b.yaml, line 9: sampling.max_tokens.max: input should be a valid number; it is 'lots'."


def test_model_key_under_engine_is_refused(tmp_path):
    path = write(tmp_path, "dup.yaml", GOOD.replace("engine:\n", "engine:\n  model: foo/bar\n"))
    assert "engine key 'model' belongs at the top level" in error_of(path)


def test_duplicate_names_keep_the_first_and_report_the_second(tmp_path):
    write(tmp_path, "a.yaml", GOOD)
    write(tmp_path, "b.yaml", GOOD)
    catalog = load_presets(tmp_path)
    assert list(catalog.presets) == ["Tiny"]
    assert catalog.problems["b"].endswith("the name 'Tiny' is already used by " + str(tmp_path / "a.yaml") + "; give each preset its own name.")


def test_one_bad_file_never_hides_the_good_ones(tmp_path):
    write(tmp_path, "good.yaml", GOOD)
    write(tmp_path, "bad.yaml", "name: [")
    catalog = load_presets(tmp_path)
    assert list(catalog.presets) == ["Tiny"] and list(catalog.problems) == ["bad"]
    with pytest.raises(PresetError, match="not valid YAML"):
        catalog.get("bad")


def test_presets_sharing_model_and_engine_have_one_engine_key():
    catalog = load_presets()
    default = catalog.get("smollm2-135m-cpu")
    deterministic = catalog.get("smollm2-135m-cpu-deterministic")
    assert default.engine_key == deterministic.engine_key
    assert default.sampling.defaults != deterministic.sampling.defaults
    assert catalog.get("qwen2.5-7b-low-latency").engine_key != catalog.get("qwen2.5-7b-high-throughput").engine_key


def test_bundled_presets_are_all_valid_and_describe_themselves():
    catalog = load_presets(DEFAULT_PRESETS_DIR)
    assert catalog.problems == {}
    assert len(catalog.presets) >= 7
    for preset in catalog.presets.values():
        assert preset.description.endswith(".")
    tags = {tag for preset in catalog.presets.values() for tag in preset.tags}
    assert {"deterministic", "latency", "throughput", "multi-node", "seed-article"} <= tags


def test_gpu_presets_are_unusable_without_a_gpu_and_say_why():
    catalog = load_presets()
    usable = catalog.usable(has_gpu=False)
    assert all(not p.needs_gpu for p in usable.values()) and "SmolLM2 135M (CPU)" in usable
    reasons = catalog.unusable(has_gpu=False)
    assert reasons["Qwen2.5 7B (1 GPU, low latency)"] == "Qwen2.5 7B (1 GPU, low latency) needs an NVIDIA GPU; this machine has none."


# `app.py --check-presets` on files with problems, and on the bundled presets: tests/test_console.py
# (one run each way: each imports vLLM).


@pytest.mark.app  # runs app.py
def test_list_presets_names_each_with_its_file_at_once_without_vllm(tmp_path):
    (presets := tmp_path / "presets").mkdir()
    write(presets, "tiny.yaml", GOOD)
    result = finished(app_command("--list-presets", "--presets-dir", str(presets), env=without_vllm(tmp_path)))
    assert result.returncode == 0 and "Tiny  [tiny]  cpu  embedded" in result.stdout, result.stdout + result.stderr


HOSTILE = [
    ("billion laughs", 'name: &a ["lol", "lol"]\ndescription: &b [*a, *a]\nmodel: [*b, *b]\n',
     "bomb.yaml, line 1: YAML anchors and aliases are not allowed in presets; write the values out."),
    ("python object tag", "name: !!python/object/apply:os.system ['echo pwned']\n", "bomb.yaml, line 1: this is not valid YAML"),
    ("a list at the top", "- name: x\n", "bomb.yaml: a preset is a YAML mapping of keys (name, description, model, ...)."),
    ("an empty file", "", "bomb.yaml: a preset is a YAML mapping of keys (name, description, model, ...)."),
    ("a huge file", "# " + "x" * 70_000 + "\n", "bomb.yaml: the file is larger than 64 KB; a preset is a few lines."),
    ("name of the wrong type", GOOD.replace("name: Tiny", "name: [1, 2]"), "bomb.yaml, line 1: name: input should be a valid string; it is [1, 2]"),
    ("engine not a mapping", GOOD.replace("engine:\n  max_model_len: 1024\n  kv_cache_memory_bytes: 268435456\n", "engine: 5\n"),
     "bomb.yaml, line 4: engine: input should be a valid dictionary; it is 5"),
    ("engine boolean as text", GOOD.replace("max_model_len: 1024", "enforce_eager: 'yes'"), "bomb.yaml, line 5: engine.enforce_eager must be true or false; it is 'yes'"),
    ("a model name that is a shell command", GOOD.replace("model: embedded", "model: $(rm -rf /)"),
     "bomb.yaml, line 3: model '$(rm -rf /)' is neither 'embedded', a folder (start it with ./ or /) nor a Hugging Face repo id like Qwen/Qwen2.5-7B-Instruct."),
]


@pytest.mark.parametrize(("text", "expected"), [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE])
def test_hostile_preset_files_are_refused_precisely(tmp_path, text, expected):
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    message = error_of(path)
    assert message.startswith(expected), message


def test_a_file_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x01garbage")
    assert error_of(path).startswith("binary.yaml: cannot read the file")
