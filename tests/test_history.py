from chat.history import is_annotation, text_of, to_model_messages

STATS = {"title": "📊 replied after 0.31 s · 40 tokens at 12 a second · 3.6 s in all · finished", "status": "done"}


def gradio_history():
    """History exactly as Gradio 6 hands it to the chat function."""
    return [
        {"role": "user", "content": [{"type": "text", "text": "Hi there"}], "metadata": None, "options": None},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello! "}, {"type": "text", "text": "How can I help?"}], "metadata": {}, "options": []},
        {"role": "assistant", "content": [{"type": "text", "text": "| Preset | SmolLM2 |"}], "metadata": STATS, "options": []},
        {"role": "user", "content": [{"type": "file", "file": {"path": "/tmp/x.png"}}, {"type": "text", "text": "and this?"}], "metadata": None},
        {"role": "assistant", "content": "", "metadata": {"title": "⚠️ Type a message first."}},
    ]


def test_content_parts_are_flattened_to_text():
    assert text_of([{"type": "text", "text": "a"}, {"type": "file", "file": {}}, {"type": "text", "text": "b"}]) == "ab"
    assert text_of("plain") == "plain"
    assert text_of(None) == ""


def test_stats_and_errors_are_never_sent_to_the_model():
    messages = to_model_messages(gradio_history(), "Next question", system_prompt="Be brief.")
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Next question"},  # "and this?" only got an error
    ]
    assert not any("📊" in m["content"] or "Preset" in m["content"] for m in messages)


def test_annotations_are_recognised_by_their_title():
    assert is_annotation({"role": "assistant", "content": "", "metadata": STATS})
    assert not is_annotation({"role": "assistant", "content": "x", "metadata": {}})
    assert not is_annotation({"role": "assistant", "content": "x"})


def test_blank_system_prompt_is_left_out():
    assert to_model_messages([], "Hello", system_prompt="   ") == [{"role": "user", "content": "Hello"}]


def test_a_message_that_was_never_answered_is_left_out():
    history = [
        {"role": "user", "content": "word " * 3000},
        {"role": "assistant", "content": "", "metadata": {"title": "⚠️ Your conversation is 4,000 tokens; ..."}},
        {"role": "user", "content": "Tell me a story"},
        {"role": "assistant", "content": "", "metadata": {"title": "📊 stopped by you"}},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "assistant", "content": "details", "metadata": {"title": "📊 finished"}},
    ]
    assert to_model_messages(history, "Bye") == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
