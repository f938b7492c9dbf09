import pytest

from chat.sampling import SamplingRules
from chat.stats import SUMMARY, Finish, ReplyProgress, ReplyStats


def make_stats(**changes):
    values = dict(
        preset="Tiny", sampling=SamplingRules().defaults, prompt_tokens=30, cached_prompt_tokens=16,
        generated_tokens=41, first_token_s=0.25, total_s=2.25, queue_s=0.2, prefill_s=0.1, decode_s=2.0,
        finish=Finish.MAX_TOKENS, context_limit=2048,
    )
    values.update(changes)
    return ReplyStats(**values)


def test_speed_excludes_the_first_token():
    assert make_stats().tokens_per_s == 20.0  # 40 tokens after the first, in 2 s


def test_speed_falls_back_to_the_app_clock_without_engine_times():
    assert make_stats(decode_s=None).tokens_per_s == 20.0  # 2.25 - 0.25


def test_summary_says_every_number_in_plain_words():
    line = make_stats().summary()
    assert line == "replied after 0.25 s (0.20 s waiting in line) · 41 tokens at 20 a second · 2.2 s in all · reached the Max tokens limit"
    loaded = make_stats(engine_wait_s=3.25, queue_s=0.01, generated_tokens=3, decode_s=0.25).summary()
    assert loaded == (
        "the model took 3.2 s to load · replied after 0.25 s · 3 tokens at 8.0 a second · 2.2 s in all · reached the Max tokens limit")
    assert (numbers := SUMMARY.fullmatch(loaded)) and numbers["load"] == "3.2" and numbers["first"] == "0.25"


@pytest.mark.parametrize(("tokens", "said"), [(0, "0 tokens ·"), (1, "1 token ·"), (2, "2 tokens at"), (1234, "1,234 tokens at")])
def test_summary_counts_tokens_in_good_english(tokens, said):
    line = make_stats(generated_tokens=tokens).summary()
    assert f" · {said}" in line and "1 tokens" not in line


def test_summary_numbers_read_back_and_agree_with_the_details():
    stats = make_stats(first_token_s=1.5, total_s=12.0, generated_tokens=400, decode_s=10.0)
    numbers = SUMMARY.search(stats.summary())
    assert numbers is not None, stats.summary()
    assert numbers["first"] == "1.5" and numbers["tokens"] == "400" and numbers["rate"] == "40" and numbers["total"] == "12.0"
    details = stats.details()
    assert "| Replied after | 1.5 s |" in details and "| In all | 12.0 s |" in details and "| Speed | 40 tokens a second |" in details


def test_details_carry_the_split_the_prompt_and_the_exact_settings():
    details = make_stats().details()
    lines = details.splitlines()
    assert lines[:2] == ["| Figure | Value | What it means |", "|---|---|---|"]  # a real header, not an empty first row
    for expected in ("| Preset | Tiny |", "| Waiting in line | 0.20 s | Part of the above: waiting for a free slot",
                     "time to first token", "(tokens/s)", "| Tokens | 41 | How much the model wrote, in tokens: the pieces", "| Prompt tokens | 30 (16 from the prefix cache) |",
                     "| Context used | 71 of 2,048 tokens |", "| Temperature | 0.7 | How adventurous", "| Max new tokens | 256 |"):
        assert expected in details
    assert all(line.count("|") == 4 for line in details.splitlines())  # every row explains itself


def test_progress_line_shows_elapsed_tokens_and_share_of_max_tokens():
    progress = ReplyProgress(max_tokens=200, started=100.0)
    assert progress.line(100.4) == "Reading your message… 0.40 s"
    progress.first_token_at, progress.tokens = 100.5, 50
    assert progress.line(103.0) == "Writing… 3.0 s · 50 tokens · 25% of Max tokens"
    progress.tokens = 1
    assert progress.line(103.0) == "Writing… 3.0 s · 1 token · 0% of Max tokens"


def test_stats_survive_a_round_trip_through_a_dict():
    stats = make_stats()
    assert ReplyStats.from_dict(stats.as_dict()) == stats
