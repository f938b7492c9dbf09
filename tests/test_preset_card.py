"""The preset card: plain words first, engine arguments with units under a fold that really folds."""

from __future__ import annotations

import dataclasses

import pytest

from chat.presets import load_presets
from chat.ui.preset_card import binary_size, engine_value, preset_card
from tests.conftest import free_port

FOLD = "<details><summary>Technical details</summary>"


def plain_and_technical(card: str) -> tuple[str, str]:
    plain, _, technical = card.partition(FOLD)
    assert technical.rstrip().endswith("</details>"), card
    return plain, technical


def test_the_default_card_speaks_plainly_first_and_keeps_the_engine_for_later(default_preset):
    plain, technical = plain_and_technical(preset_card(default_preset))
    assert default_preset.description in plain
    assert "Runs on this computer's processor; no graphics card (GPU) needed." in plain
    assert "Holds a conversation of up to 2,048 tokens (about 1,500 words)" in plain
    assert "Model: SmolLM2-135M-Instruct, built in (nothing to download)." in plain
    assert "Tags: cpu, tiny, default" in plain
    assert "`" not in plain, "engine names belong under Technical details"
    assert "`kv_cache_memory_bytes`: 1 GiB kept for the replies being written (the KV cache)" in technical
    assert "`enforce_eager`: yes (skips graph compilation" in technical
    assert "`max_num_seqs`: 64 replies written at once, at most" in technical
    assert "A reply is stopped after 60 s." in technical
    assert "1073741824" not in technical and "True" not in technical


def test_gpu_presets_say_how_many_gpus_and_how_much_memory_each():
    catalog = load_presets(check_engine=False)
    two = preset_card(catalog.get("qwen2.5-7b-chat"))
    assert "Needs 2 NVIDIA GPUs with at least 24 GB of memory each." in two
    assert "`tensor_parallel_size`: each layer split across 2 GPUs" in two
    assert "`gpu_memory_utilization`: 90% of each GPU's memory" in two
    assert "[Qwen/Qwen2.5-7B-Instruct](https://huggingface.co/Qwen/Qwen2.5-7B-Instruct), downloaded from Hugging Face" in two
    one = preset_card(catalog.get("qwen2.5-7b-high-throughput"))
    assert "Needs 1 NVIDIA GPU with at least 40 GB of memory." in one
    assert "`enable_prefix_caching`: yes (reuses the work" in one
    # Every setting the preset gives, one equal to vLLM's default too: comparing presets, "no" beside
    # another's "yes" is the difference a reader looks for.
    assert "`enforce_eager`: no" in one and "`enforce_eager`: yes" in two


def test_a_preset_without_engine_settings_or_context_length_says_so(default_preset):
    bare = dataclasses.replace(default_preset, engine={}, tags=(), timeout_s=None)
    plain, technical = plain_and_technical(preset_card(bare))
    assert "Holds a conversation as long as the model allows." in plain and "Tags" not in plain
    assert "- none: vLLM's defaults" in technical and "stopped after" not in technical


def test_names_and_descriptions_are_shown_as_text_never_as_html(default_preset):
    hostile = dataclasses.replace(default_preset, name="<img src=x>", description="<script>alert(1)</script>")
    card = preset_card(hostile)
    assert "<img" not in card and "<script" not in card and "&lt;script&gt;" in card


@pytest.mark.parametrize(("size", "shown"), [
    (1073741824, "1 GiB"), (268435456, "256 MiB"), (3 * 2**29, "1.5 GiB"), (1536, "1.5 KiB"), (512, "512 bytes"),
    (2**41, "2 TiB"),
])
def test_sizes_in_bytes_are_shown_in_binary_units(size, shown):
    assert binary_size(size) == shown
    assert engine_value("some_new_limit_bytes", size) == shown


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("enforce_eager", False, "no"),
    ("a_switch_we_do_not_know", True, "yes"),
    ("max_num_batched_tokens", 16384, "16,384 tokens per engine step, at most"),
    ("a_count_we_do_not_know", 123456, "123,456"),
    ("a_ratio_we_do_not_know", 0.25, "0.25"),
    ("dtype", "bfloat16", "bfloat16"),
    ("distributed_executor_backend", "<ray>", "&lt;ray&gt;"),
])
def test_engine_values_are_shown_as_a_person_reads_them(key, value, shown):
    assert engine_value(key, value) == shown


def test_the_technical_details_fold_opens_in_the_browser(browser, default_preset):
    import gradio as gr

    with gr.Blocks() as demo:
        gr.Markdown(preset_card(default_preset), elem_id="preset-card")
    port = free_port()
    demo.launch(server_port=port, prevent_thread_lock=True, quiet=True)
    page = browser.new_page()
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        card = page.locator("#preset-card")
        card.locator("summary").wait_for()
        assert card.locator("summary").inner_text() == "Technical details"
        assert card.get_by_text("Runs on this computer's processor").is_visible()
        engine_line = card.locator("details li").filter(has_text="max_model_len")
        assert not engine_line.is_visible(), "the engine settings start folded away"
        card.locator("summary").click()
        engine_line.wait_for(state="visible")
        assert engine_line.locator("code").inner_text() == "max_model_len"
    finally:
        page.close()
        demo.close()
