"""The page in a real browser: Debian's Chromium, headless, driven by Playwright."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from chat.stats import REPLIED, SUMMARY
from chat.ui.messages import NO_TEXT_YET
from tests.conftest import OUTPUT, ROOT
from tests.pages import wait_drawn

pytestmark = pytest.mark.browser

# A chat's bot messages as Gradio draws them, in the chat `{}`: a message's own text, and the title
# lines (stats, waits, errors: each in a `.thought-group`). Gradio marks a titled message's box
# `.thought` only when text comes before it, so a reply stopped before its first word (its stats
# line alone) has none: the group, not that class, tells the two apart.
BOT_TEXT = "{} .bot-row .message > [data-testid=bot]:not(:has(> .thought-group))"
BOT_TITLE = "{} .bot-row [data-testid=bot] > .thought-group > .title"
REPLY_TEXT, REPLY_TITLE = BOT_TEXT.format("#chatbot"), BOT_TITLE.format("#chatbot")
COMPARE_TEXT, COMPARE_TITLE = BOT_TEXT.format("#compare-chat-{}"), BOT_TITLE.format("#compare-chat-{}")  # by column
# What a reply's box says before its first word (for screen readers; out of sight): not the reply's text.
NO_TEXT = re.sub(r"<[^>]+>", "", NO_TEXT_YET)


def is_text(shown: str) -> bool:
    """Whether a reply's box shows the reply's own text (not a wait, not the box before the first word)."""
    return bool(shown.strip()) and not shown.startswith("⏳") and shown.strip() != NO_TEXT


MAX_TOKENS = "#knob-max_tokens input[type=number]"
# For a test that needs a reply but not a long one: the embedded model writes about 6 tokens a
# second on a 2-core AVX2 machine, where a reply of the default 256 tokens takes most of a minute.
SHORT = 24
# For a reply a test stops or leaves while it is written: the stand-in writes its "long" reply to Max
# tokens, and the default 256 take it under 4 s, which a busy machine's clicks and polls can outlast
# (a CI run on the AMD EPYC found Stop already hidden). 1,024 take it 15 s.
TO_STOP = 1024


def send(page, text: str, max_tokens: int | None = None) -> None:
    """Type `text` and send it; with `max_tokens`, first set the reply's cap in the settings (in view
    at a laptop's width) as a person would."""
    if max_tokens is not None:
        set_max_tokens(page, max_tokens)
    box = page.locator("#message textarea")
    box.fill(text)
    box.press("Enter")


def set_max_tokens(page, max_tokens: int) -> None:
    knob = page.locator(MAX_TOKENS)
    knob.fill(str(max_tokens))
    knob.press("Tab")
    page.wait_for_function(f"document.querySelector({MAX_TOKENS!r}).value === '{max_tokens}'")


def watch_reply(page, until: str, within_s: float = 90) -> tuple[list[str], str]:
    """Poll the last reply until its stats title contains `until`; return texts seen and the title."""
    seen: list[str] = []
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        texts = page.locator(REPLY_TEXT).all_inner_texts()
        if texts and (not seen or texts[-1] != seen[-1]):
            seen.append(texts[-1])
        titles = page.locator(REPLY_TITLE).all_inner_texts()
        if titles and until in titles[-1]:
            return seen, titles[-1]
        time.sleep(0.05)
    raise AssertionError(f"no reply title containing {until!r} within {within_s} s; texts seen: {seen[-3:]}")


def watch_second_reply(page) -> None:
    """Wait until the second reply's stats line says it replied (the first's may say so too: a stopped one's does)."""
    page.wait_for_function(f"document.querySelectorAll({REPLY_TITLE!r}).length === 2"
                           f" && document.querySelectorAll({REPLY_TITLE!r})[1].innerText.includes({REPLIED!r})", timeout=90_000)


def test_a_reply_grows_word_by_word_with_stats_beneath_it(real_page, real_app):
    # Capped: the preset's 256 tokens took over 90 s in a CI run on the 2-core AMD EPYC while other
    # tests shared its cores (the text was still growing); 64 are a few verses, enough to grow in steps.
    send(real_page, "Write a short poem about the moon.", max_tokens=64)
    seen, title = watch_reply(real_page, REPLIED)
    growing = [text for text in seen if is_text(text)]
    assert len(growing) >= 3, f"the reply should grow in steps, saw {growing}"
    # Letters and digits never go away (the newest text is plain until Gradio draws it as Markdown,
    # which may drop a space or a * around it).
    letters = [len(re.findall(r"[^\W_]", text)) for text in growing]
    assert all(a <= b for a, b in zip(letters, letters[1:], strict=False)), growing
    assert (numbers := SUMMARY.search(title)) and numbers["rate"], title
    reply_box = real_page.locator(REPLY_TEXT).last.bounding_box()
    stats_box = real_page.locator(REPLY_TITLE).last.bounding_box()
    assert stats_box["y"] > reply_box["y"] + reply_box["height"] - 1, "stats sit beneath the reply"
    assert real_page.locator(REPLY_TITLE).last.is_visible()
    real_page.screenshot(path=str(OUTPUT / "chat-with-stats.png"))
    if os.environ.get("UPDATE_SCREENSHOTS"):  # the README's picture: UPDATE_SCREENSHOTS=1 scripts/test -k grows
        real_page.screenshot(path=str(ROOT / "docs" / "screenshot.png"))


def test_the_engine_line_beneath_the_chat_says_how_the_engine_is(page):
    """Kept current by the page's own script (a plain request every 2 s), not by a Gradio timer."""
    page.wait_for_function("document.querySelector('#engine-status')?.innerText.startsWith('Engine: Ready · ')")
    assert "KV cache" in page.locator("#engine-status").inner_text()


# Before the page's scripts: how many animation frames the page has asked for, and when it last did
# (bench/idle_page.py counts them the same way).
FRAMES_ASKED = """window.framesAsked = 0;
window.frameAskedAt = 0;
(() => {
  const request = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (callback) => {
    window.framesAsked++;
    window.frameAskedAt = performance.now();
    return request(callback);
  };
})();"""


def test_a_page_left_alone_after_a_reply_asks_for_no_frames(open_page, app_server):
    """An open page nobody uses draws nothing: Gradio's page-loading indicator left a timer asking for
    every frame (60 a second) for the page's life, ~0.1 s of CPU a second (chat/ui/status_timers.js)."""
    page = open_page(app_server.url, init_script=FRAMES_ASKED)
    send(page, "Hello there.", max_tokens=SHORT)
    watch_reply(page, REPLIED)
    # Polled on a timer: Playwright's default polling asks for frames itself.
    page.wait_for_function("performance.now() - window.frameAskedAt > 2000", polling=100, timeout=20_000)


def test_stop_ends_the_reply_as_stopped_by_you_and_frees_the_engine(real_page, real_app):
    send(real_page, "Tell me a very long story about a dragon who learns to bake bread.")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        texts = real_page.locator(REPLY_TEXT).all_inner_texts()
        if texts and len(texts[-1]) > 20:
            break
        time.sleep(0.05)
    real_page.locator("#stop").click()
    _, title = watch_reply(real_page, "stopped by you", within_s=30)  # as long as the stand-in's test allows
    assert "tokens" in title
    body = real_app.wait_idle(timeout=30)
    assert all(e["running"] == 0 and e["unfinished"] == 0 for e in body["engines"])
    send(real_page, "Say hi.", max_tokens=SHORT)  # the conversation goes on after a stop
    watch_second_reply(real_page)


def titles(page) -> list[str]:
    return page.locator(REPLY_TITLE).all_inner_texts()


def wait_for_one_new_reply(page, old_title: str) -> None:
    """Until the chat holds one finished reply whose stats line is not `old_title`: written anew."""
    page.wait_for_function(
        "([selector, old, done]) => { const t = [...document.querySelectorAll(selector)].map(e => e.innerText);"
        " return t.length === 1 && t[0] !== old && t[0].includes(done); }",
        arg=[REPLY_TITLE, old_title, REPLIED],
        timeout=60_000,
    )


def test_stop_shows_while_the_page_s_own_reply_is_written_over_its_socket(page, app_server):
    """The page itself says when the reply it began is being written (live.js's data-writing), and
    Stop shows then, not only while Gradio's turn looks busy: a full run on a busy machine once wrote
    a whole reply on the real engine with Stop hidden (not reproduced here: Gradio's states show it
    too on an idle machine; this checks the page's own signal, from the first text to the stop)."""
    send(page, "Write a long story about a lighthouse.", max_tokens=TO_STOP)  # the stand-in writes it to Max tokens
    page.wait_for_function(f"(document.querySelector({REPLY_TEXT!r})?.innerText || '').length > 40", timeout=30_000)
    assert page.locator("html[data-writing]").count() == 1 and page.locator("#stop").is_visible()
    page.locator("#stop").click()
    watch_reply(page, "stopped by you", within_s=30)
    page.wait_for_function("!document.documentElement.hasAttribute('data-writing')")
    # Gradio's turn, which ends a moment after the page's own signal on a busy machine, hides it too.
    page.locator("#stop").wait_for(state="hidden", timeout=30_000)
    assert app_server.wait_idle()["engines"][0]["running"] == 0


def test_retry_writes_a_new_reply_with_new_stats(real_page):
    send(real_page, "Name one planet.", max_tokens=SHORT)
    watch_reply(real_page, REPLIED)
    first = titles(real_page)[-1]
    real_page.get_by_role("button", name="Retry").last.click()
    wait_for_one_new_reply(real_page, first)
    assert len(real_page.locator("#chatbot .user-row").all()) == 1  # retried, not added


def test_undo_puts_the_message_back_in_the_box(page):
    send(page, "Name one bird.", max_tokens=SHORT)
    watch_reply(page, REPLIED)
    page.locator("#chatbot").get_by_role("button", name="Undo").last.click()
    page.wait_for_function("document.querySelector('#message textarea').value === 'Name one bird.'")
    page.wait_for_function("!document.querySelector('#chatbot .user-row')")


def test_edit_regenerates_from_the_edited_message(page):
    """Edit, clicked the moment the reply's stats show: the page shows them a moment before the turn's
    last update (held back a second here, as a busy machine does), and an edit made then lost its
    reply (a fresh CI run). The buttons beneath the messages wait for the turn's end."""
    page.add_init_script(LATE_TURN_ENDS)
    page.reload()
    wait_drawn(page)
    send(page, "Name one fruit.", max_tokens=SHORT)
    watch_reply(page, REPLIED)
    first = titles(page)[-1]
    during = page.evaluate("""() => [document.querySelector('#message textarea').disabled,
        [...document.querySelectorAll('#chatbot .message-buttons')].map(e => getComputedStyle(e).visibility)]""")
    assert not during[0] or (during[1] and set(during[1]) <= {"hidden"}), f"the turn is not over, yet buttons show: {during}"
    page.get_by_role("button", name="Edit").last.click()  # waits until it shows
    box = page.locator("#chatbot .user-row textarea").last
    box.fill("Name one vegetable, in a single word.")
    box.press("Enter")  # sends, as in the message box
    # The proof is in the user's message (replaced, not added) and a reply with new stats: the stand-in
    # engine answers "single word" with a reply of its own length, so its stats line differs too.
    wait_for_one_new_reply(page, first)
    users = page.locator("#chatbot .user-row").all_inner_texts()
    assert len(users) == 1 and "vegetable" in users[0] and "fruit" not in users[0], users


PENDING = '#chatbot [aria-busy="true"] .loading-spinner'  # a reply's line while it is written (chat/ui/live.js)


def test_the_message_box_waits_while_a_retry_is_written(page):
    """Retry runs Gradio's own events, which leave the message box open: a message sent while the
    retry's reply was written wrote a second reply into the chat at the same time and left the
    first one unfinished. The page holds the box, and hides the buttons, while a reply is written."""
    send(page, "Tell me a long story.", max_tokens=SHORT)  # the stand-in writes it to Max tokens
    watch_reply(page, REPLIED)
    set_max_tokens(page, 300)  # the retry's reply: ~4.5 s
    page.get_by_role("button", name="Retry").last.click()
    page.wait_for_function(f"document.querySelector({PENDING!r}) !== null")
    busy, shut, arrow, buttons = page.evaluate(f"""() => [document.querySelector({PENDING!r}) !== null,
        document.querySelector('#message textarea').disabled,
        getComputedStyle(document.querySelector('#message button.submit-button')).visibility,
        [...document.querySelectorAll('#chatbot .message-buttons')].map(e => getComputedStyle(e).visibility)]""")
    # The send arrow sends whatever the box holds, shut or not: it goes with the box.
    assert busy and shut and arrow == "hidden" and buttons and set(buttons) <= {"hidden"}, (busy, shut, arrow, buttons)
    # Typed at once: it goes in once the retry's reply is written. A one-word reply (without "single
    # word" the stand-in would answer the story's cue again, to Max tokens): one that ended while its
    # turn sent its first redraw stayed "Writing… 1 token" (chat/live.py `ReplyLog.drawn`).
    send(page, "Name one fruit, in a single word.")
    watch_second_reply(page)
    assert REPLIED in titles(page)[0], titles(page)
    users = page.locator("#chatbot .user-row").all_inner_texts()
    assert [u.strip() for u in users] == ["Tell me a long story.", "Name one fruit, in a single word."], users


def test_a_reply_line_left_busy_by_a_broken_turn_holds_the_box_only_a_while(page):
    """A turn that broke mid-reply (its worker gone) leaves its "Writing…" line in the chat for good:
    the box is held while such a line changes, and given back once it has not for a while (30 s;
    2 s here), until it changes again."""
    page.add_init_script("window.chatStaleMs = 2000")
    page.reload()
    wait_drawn(page)
    page.evaluate("""() => { const line = document.createElement('button');
        line.setAttribute('aria-busy', 'true'); line.innerHTML = 'Writing… <span class="loading-spinner"></span>';
        document.querySelector('#chatbot').appendChild(line); }""")
    shut, opened = ("document.querySelector('#message textarea').disabled",
                    "!document.querySelector('#message textarea').disabled")
    page.wait_for_function(shut, timeout=10_000)
    page.wait_for_function(opened, timeout=20_000)
    # A line that changes again is a reply being written again (one that waited long for a free slot).
    page.evaluate("() => { document.querySelector('#chatbot [aria-busy=true]').firstChild.data = 'Writing… 0:31 '; }")
    page.wait_for_function(shut, timeout=10_000)
    page.evaluate("() => document.querySelector('#chatbot [aria-busy=true]').remove()")
    page.wait_for_function(opened, timeout=10_000)
    send(page, "Name one fruit.", max_tokens=SHORT)  # and the chat goes on
    watch_reply(page, REPLIED)


def test_a_reply_that_failed_leaves_the_chat_ready_for_the_next_message(page):
    """Gradio marks every line without a body busy (aria-busy), a failed reply's line too: Stop showed
    for good after one, Retry, Undo and Edit stayed hidden and the box was held 30 s. Only a pending
    line (its spinner) counts as a reply being written."""
    send(page, "owl " * 3000)  # longer than the model's context: one sentence, no reply
    page.wait_for_function("document.querySelector('#chatbot').innerText.includes('Start a new chat or shorten your message')")
    page.locator("#stop").wait_for(state="hidden", timeout=10_000)
    page.wait_for_function("""() => !document.querySelector('#message textarea').disabled
        && getComputedStyle(document.querySelector('#message button.submit-button')).visibility === 'visible'
        && [...document.querySelectorAll('#chatbot .message-buttons')].some(e => getComputedStyle(e).visibility === 'visible')""",
                           timeout=10_000)
    assert page.locator('#chatbot [aria-busy="true"]').count() >= 1, "the failed reply's line is still Gradio's busy one"


def test_history_survives_a_reload_with_its_stats(page):
    send(page, "Say something about owls.", max_tokens=SHORT)
    _, title = watch_reply(page, REPLIED)
    assert int(SUMMARY.search(title)["tokens"]) <= SHORT, f"the cap set in the settings held: {title}"
    page.wait_for_function(  # saved once the reply is done: then it also shows in the list of chats
        "[...document.querySelectorAll('*')].filter(e => e.children.length === 0 && e.innerText === 'Say something about owls.').length >= 2",
        timeout=15_000,
    )
    page.reload()
    wait_drawn(page)
    page.wait_for_selector(REPLY_TITLE, timeout=60_000)  # back in the conversation, with no click
    assert titles(page)[-1] == title
    assert "Say something about owls." in page.locator("#chatbot").inner_text()
    send(page, "And about cats?", max_tokens=SHORT)  # it goes on in the same saved chat
    page.wait_for_function(f"[...document.querySelectorAll({REPLY_TITLE!r})].filter(t => t.innerText.includes({REPLIED!r})).length === 2",
                           timeout=90_000)
    # The turn is over (the message box takes text again), and with it the chat is saved: a New chat
    # clicked now is what a reload shows, not overtaken by a save still on its way.
    page.wait_for_function("!document.querySelector('#message textarea').disabled")
    page.locator("#new-chat").click()  # a new chat is what a reload then shows
    page.wait_for_function("!document.querySelector('#chatbot').innerText.includes('owls')")
    page.reload()
    wait_drawn(page)
    page.get_by_text("Say something about owls.").first.wait_for()  # in the saved chats list
    assert "owls" not in page.locator("#chatbot").inner_text()
    page.get_by_text("Say something about owls.").first.click()
    page.wait_for_function(f"document.querySelectorAll({REPLY_TITLE!r}).length === 2")


# The page's stream of Gradio's messages, with each turn's end held back a second (a slow server or
# network between a turn's last update and its end, as CI's machine was once).
LATE_TURN_ENDS = """(() => {
  const fetched = window.fetch;
  window.fetch = async (...args) => {
    const response = await fetched(...args);
    if (!String(args[0]?.url ?? args[0]).includes("queue/data?") || !response.body) return response;
    const decoder = new TextDecoder(), encoder = new TextEncoder();
    const late = new TransformStream({
      async transform(chunk, stream) {
        const text = decoder.decode(chunk, {stream: true});
        const end = text.indexOf('"process_completed"');
        const cut = end < 0 ? -1 : Math.max(0, text.lastIndexOf("data:", end));
        if (cut < 0) return stream.enqueue(encoder.encode(text));
        stream.enqueue(encoder.encode(text.slice(0, cut)));
        await new Promise((resolve) => setTimeout(resolve, 1000));
        stream.enqueue(encoder.encode(text.slice(cut)));
      },
    });
    return new Response(response.body.pipeThrough(late), {status: response.status, headers: response.headers});
  };
})()"""


def test_a_message_sent_the_moment_the_box_opens_again_is_sent(page):
    """The message box takes text again only once the page counts the turn as over: Enter pressed
    at that very moment sends. (Opened by the turn's last update, the box took a message the page
    then dropped, as it still waited for the turn's end: the text sat in the box, unsent.)"""
    page.add_init_script(LATE_TURN_ENDS)
    page.reload()
    wait_drawn(page)
    send(page, "Say hi.", max_tokens=SHORT)
    page.wait_for_function("document.querySelector('#message textarea').disabled")
    page.evaluate("""() => {
      const box = document.querySelector('#message textarea');
      new MutationObserver((_, observer) => {
        if (box.disabled) return;
        observer.disconnect();
        box.value = 'And again.';
        box.dispatchEvent(new Event('input', {bubbles: true}));
        box.dispatchEvent(new KeyboardEvent('keypress', {key: 'Enter', bubbles: true, cancelable: true}));
      }).observe(box, {attributes: true, attributeFilter: ['disabled']});
    }""")
    page.wait_for_function(f"[...document.querySelectorAll({REPLY_TITLE!r})].filter(t => t.innerText.includes({REPLIED!r})).length === 2",
                           timeout=90_000)
    assert page.locator("#chatbot .user-row").all_inner_texts()[-1].strip() == "And again."
    assert page.locator("#message textarea").input_value() == ""


def test_a_narrow_phone_screen_shows_the_chat_without_sideways_scrolling(open_page, app_server):
    page = open_page(app_server.url, width=390, height=844, touch=True, mobile=True)
    send(page, "Hi!")
    watch_reply(page, REPLIED)
    assert page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth + 1")
    assert page.locator(REPLY_TITLE).last.is_visible()
    page.screenshot(path=str(OUTPUT / "phone.png"), full_page=True)


def contrast(page, selector: str) -> float:
    """WCAG contrast ratio between an element's text colour and the background behind it."""
    return page.evaluate(
        """(selector) => {
          const el = document.querySelector(selector);
          const rgb = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
          const lum = ([r, g, b]) => [r, g, b].map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
              .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
          let bg = el, color = getComputedStyle(el).backgroundColor;
          while (bg && (color === 'rgba(0, 0, 0, 0)' || color === 'transparent')) { bg = bg.parentElement; color = bg ? getComputedStyle(bg).backgroundColor : 'rgb(255,255,255)'; }
          const a = lum(rgb(getComputedStyle(el).color)), b = lum(rgb(color));
          return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        }""",
        selector,
    )


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_replies_and_stats_are_legible_in_both_themes(open_page, app_server, theme):
    page = open_page(f"{app_server.url}?__theme={theme}", color_scheme=theme)
    send(page, "Say hello in French.", max_tokens=SHORT)
    watch_reply(page, REPLIED)
    assert contrast(page, REPLY_TEXT + " .message-content") >= 4.5
    assert contrast(page, REPLY_TITLE) >= 3
    page.screenshot(path=str(OUTPUT / f"theme-{theme}.png"))


def test_script_in_a_message_never_runs(page):
    send(page, '<img src=x onerror="window.__pwned = 1"><script>window.__pwned = 2</script> Repeat exactly: <b onmouseover=alert(1)>hi</b>', max_tokens=SHORT)
    watch_reply(page, REPLIED)
    page.locator("#chatbot").hover()
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#chatbot script").count() == 0
    assert page.locator("#chatbot [onerror], #chatbot [onmouseover]").count() == 0


def test_closing_the_tab_aborts_its_reply(open_page, app_server):
    """The engine is freed for others at once: the reply counts as cut short, not run to its end
    (it asks for a very long story). How soon, on a loaded machine, is not asserted here."""
    from tests.test_load import replies_counted

    app_server.wait_idle(timeout=60)  # the counts are this reply's alone
    before = replies_counted(app_server.url)
    page = open_page(app_server.url)
    send(page, "Tell me a very long story about the ocean.", max_tokens=TO_STOP)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(is_text(t) for t in page.locator(REPLY_TEXT).all_inner_texts()):
        time.sleep(0.05)  # the reply's bubble shows before its first word: wait for words
    status, body = app_server.health()
    assert body["engines"][0]["streams"] >= 1
    page.close()
    body = app_server.wait_idle(timeout=60)
    assert body["engines"][0]["running"] == 0 and body["engines"][0]["streams"] == 0
    after = replies_counted(app_server.url)
    ended = {finish: after.get(finish, 0) - before.get(finish, 0) for finish in after}
    assert ended.get("disconnected", 0) + ended.get("stopped_by_user", 0) == 1, ended
    assert ended.get("finished", 0) == ended.get("max_tokens", 0) == 0, ended


def test_the_conversation_can_be_saved_as_markdown_with_its_stats(page):
    send(page, "Name a colour.", max_tokens=SHORT)
    _, title = watch_reply(page, REPLIED)
    with page.expect_download(timeout=15_000) as download:
        page.locator("#save").click()  # one click
    text = Path(download.value.path()).read_text(encoding="utf-8")
    assert "**You:**" in text and "Name a colour." in text and title in text and "| Preset | SmolLM2 135M (CPU) |" in text


def test_a_test_s_pages_leave_the_next_test_only_the_cache(cached_context, app_server):
    """The pages of `open_page` share one context for its cache (tests/conftest.py): what a test's pages
    stored, cookies and local storage, is gone for the next test, as with a context of its own."""
    from tests.conftest import forget

    page = cached_context.new_page()
    page.goto(app_server.url)
    page.evaluate("() => { localStorage.setItem('left', 'behind'); document.cookie = 'left=behind; max-age=600'; }")
    assert page.evaluate("() => localStorage.getItem('left')") == "behind"
    forget(cached_context, [page])
    again = cached_context.new_page()
    again.goto(app_server.url)
    try:
        assert again.evaluate("() => localStorage.getItem('left')") is None
        assert "left=" not in again.evaluate("() => document.cookie")
        assert not [c for c in cached_context.cookies() if c["name"] == "left"]
    finally:
        forget(cached_context, [again])
