from chat.sampling import SamplingRules
from chat.stats import Finish, ReplyProgress, ReplyStats


def make_stats(**changes):
    values = dict(
        preset="Tiny", sampling=SamplingRules().defaults, prompt_tokens=30, cached_prompt_tokens=16,
        generated_tokens=41, first_token_s=0.25, total_s=2.25, queue_s=0.5, prefill_s=0.1, decode_s=2.0,
        finish=Finish.MAX_TOKENS, context_limit=2048,
    )
    values.update(changes)
    return ReplyStats(**values)


def test_speed_excludes_the_first_token():
    assert make_stats().tokens_per_s == 20.0  # 40 tokens after the first, in 2 s


def test_speed_falls_back_to_the_app_clock_without_engine_times():
    assert make_stats(decode_s=None).tokens_per_s == 20.0  # 2.25 - 0.25


def test_summary_says_why_it_stopped_in_plain_words():
    line = make_stats().summary()
    assert line == "first token 250 ms · 20.0 tokens/s · 41 tokens · 2.2 s total · queued 500 ms · reached the Max tokens limit"


def test_details_carry_the_split_the_prompt_and_the_exact_settings():
    details = make_stats().details()
    for expected in ("| Preset | Tiny |", "| Queue | 500 ms | Waiting for a free slot", "| Prompt tokens | 30 (16 from the prefix cache) |",
                     "| Context used | 71 of 2,048 tokens |", "| Temperature | 0.7 | How adventurous", "| Max new tokens | 256 |"):
        assert expected in details
    assert all(line.count("|") == 4 for line in details.splitlines())  # every row explains itself


def test_progress_line_shows_elapsed_tokens_and_share_of_max_tokens():
    progress = ReplyProgress(max_tokens=200, started=100.0)
    assert progress.line(100.4) == "Reading your message… 400 ms"
    progress.first_token_at, progress.tokens = 100.5, 50
    assert progress.line(103.0) == "Writing… 3.0 s · 50 tokens · 25% of Max tokens"


def test_stats_survive_a_round_trip_through_a_dict():
    stats = make_stats()
    assert ReplyStats.from_dict(stats.as_dict()) == stats
