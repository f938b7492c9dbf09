"""A reply reads like a finished page while it streams (chat/live.py, chat/ui/live.js): in a real
browser, sampled several times a second, it never shows Markdown syntax as text, code outside a
code block, or a block changing form; and text already shown stays where it is."""

from __future__ import annotations

import re

import pytest

from chat.stats import REPLIED
from chat.ui.messages import settled_copy
from tests.test_browser import COMPARE_TEXT, COMPARE_TITLE, REPLY_TEXT, REPLY_TITLE
from tests.test_messages import HELD_BACK, KEPT

pytestmark = pytest.mark.browser

CODE_PROMPT = "Write a Python function that adds two numbers."

DOCUMENT = """Here are the steps:

1. The best way is **to plan** and to use `code` here.
2. Second, a [link](https://example.com) and ```inline``` code.
   - nested *item*

| Name | Value |
|------|:-----:|
| a    | 1     |
| b    | 2     |

```python
def hello():
    print(f"Hello")
```

Text
---

> a quote

~~~
tilde code
~~~

Done.
"""

# What a sample of the rendered reply is, in the page: its top-level blocks as the reader sees them
# (the live box's, or Gradio's own), and the text outside code.
SAMPLE = """(root) => {
  const blocks = [];
  const holder = root.querySelector('.md') || root;
  let live = false;
  for (const child of holder.children) {
    if (child.classList.contains('live-reply')) {
      if (child.children.length) live = true;
      blocks.push(...child.children);
    } else if (child.checkVisibility()) blocks.push(child);
  }
  const top = holder.getBoundingClientRect().top;
  const prose = [];
  const walker = document.createTreeWalker(holder, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const parent = walker.currentNode.parentElement;
    if (parent.closest('pre, code, button') || !parent.checkVisibility()) continue;
    if (walker.currentNode.textContent.trim()) prose.push(walker.currentNode.textContent);
  }
  return {
    live,
    end: holder.innerText.slice(-160), // what the reader saw last, for a failure's message
    blocks: blocks.map((b) => ({tag: b.querySelector('pre') || b.tagName === 'PRE' ? 'PRE' : b.tagName,
                                top: Math.round(b.getBoundingClientRect().top - top)})),
    prose,
  };
}"""

# Samples on every change of the page (at most one per 25 ms) and every 100 ms: a page starved of CPU
# may run its timers late, and a short reply's live text could then come and go between two of them.
SAMPLER = """([selector, title, sample]) => {
  window.__samples = [];
  const describe = eval(sample);
  let last = -Infinity;
  const take = () => {
    const now = performance.now();
    if (now - last < 25) return;
    last = now;
    const replies = [...document.querySelectorAll(selector)];
    const titles = [...document.querySelectorAll(title)];
    if (replies.length) window.__samples.push({...describe(replies[replies.length - 1]), t: now,
                                               line: titles.length ? titles[titles.length - 1].innerText : ''});
  };
  window.__sampler = setInterval(take, 100);
  window.__watcher = new MutationObserver(take);
  window.__watcher.observe(document.body, {childList: true, subtree: true, characterData: true});
}"""
SAMPLES = "() => { clearInterval(window.__sampler); window.__watcher.disconnect(); return window.__samples; }"

MARKER_AS_TEXT = re.compile(r"^\s*(\d{1,9}[.)]|[-*+>]|#{1,6})(\s|$)")
CODE_AS_TEXT = re.compile(r"\bdef \w+\(|\bprint\(|\breturn \w+ ?[-+*/%(]")  # "return the result" is prose


def problems(sample: dict) -> list[str]:
    """What a reader would see as broken in one sample."""
    found = []
    for text in sample["prose"]:
        if "```" in text or "~~~" in text:
            found.append(f"a fence shown as text: {text!r}")
        if any(MARKER_AS_TEXT.match(line) for line in text.splitlines()):
            found.append(f"a list marker or heading shown as text: {text!r}")
        if "**" in text or re.search(r"^\s*\|.*\|", text, re.M):
            found.append(f"emphasis or a table row shown as text: {text!r}")
        if CODE_AS_TEXT.search(text):
            found.append(f"code outside a code block: {text!r}")
    return found


def moved(before: dict, after: dict, line_px: int) -> list[str]:
    """Blocks shown in `before` (all but its last, which may still grow into more) that changed
    form or moved by more than a line in `after`."""
    found = []
    for i, block in enumerate(before["blocks"][:-1]):
        if i >= len(after["blocks"]):
            found.append(f"block {i} ({block['tag']}) went away")
        elif after["blocks"][i]["tag"] != block["tag"]:
            found.append(f"block {i} changed from {block['tag']} to {after['blocks'][i]['tag']}")
        elif abs(after["blocks"][i]["top"] - block["top"]) > line_px:
            found.append(f"block {i} ({block['tag']}) moved {after['blocks'][i]['top'] - block['top']} px")
    return found


def check_samples(samples: list[dict], line_px: int = 26) -> None:
    assert samples, "no sample of the reply was taken"
    bad = [(n, p) for n, s in enumerate(samples) for p in problems(s)]
    bad += [(n, p) for n, (a, b) in enumerate(zip(samples, samples[1:], strict=False), 1) for p in moved(a, b, line_px)]
    # The moments around the first broken one, as the page had them (is it the live box or Gradio's copy?).
    around = samples[max(bad[0][0] - 1, 0):bad[0][0] + 2] if bad else []
    assert not bad, f"{len(bad)} broken moments of {len(samples)}, first: {bad[:3]}; around the first: {around}"


def test_every_moment_of_a_reply_with_a_list_a_table_and_code_renders_as_formatted_text(page):
    """The page's renderer, given the reference reply one character more at a time."""
    samples = page.evaluate(
        """([doc, sample]) => {
            const describe = eval(sample);
            const holder = document.createElement('div');
            holder.className = 'message-content';
            holder.innerHTML = '<span class="md chatbot prose"></span>';
            document.querySelector('#chatbot').append(holder);
            const md = holder.firstChild;
            const out = [];
            for (let i = 1; i <= doc.length; i++) {
                md.innerHTML = window.chatLive.render(doc.slice(0, i));
                out.push(describe(holder));
            }
            holder.remove();
            return out;
        }""",
        [DOCUMENT, SAMPLE],
    )
    check_samples(samples)
    final = [b["tag"] for b in samples[-1]["blocks"]]
    assert final == ["P", "OL", "TABLE", "PRE", "H2", "BLOCKQUOTE", "PRE", "P"], final
    # The page's box and Gradio's copy (shown while the box is empty) settle every moment of a reply
    # alike: live.js `settled` and chat/ui/messages.py `settled_copy`, the same steps in two languages
    # (and one pattern, MAY_BECOME, read by two regular-expression engines).
    texts = [text for text, _ in HELD_BACK + KEPT] + [DOCUMENT[:i] for i in range(len(DOCUMENT) + 1)]
    shown = page.evaluate("(texts) => texts.map((text) => window.chatLive.settled(text))", texts)
    differ = [(text, mine, copy) for text, mine in zip(texts, shown, strict=True) if mine != (copy := settled_copy(text))]
    assert not differ, f"{len(differ)} of {len(texts)} differ, first (text, page, copy): {differ[:3]}"


def test_what_a_reply_may_not_do_it_cannot_do_while_streaming_either(page):
    html = page.evaluate("""() => window.chatLive.render(
        '<img src=x onerror="window.__pwned = 1"><script>window.__pwned = 2</script>\\n\\n' +
        '[click](javascript:window.__pwned=3) ![pixel](https://example.com/p.png) [ok](https://example.com)\\n')""")
    holder = page.evaluate("(html) => { const t = document.createElement('template'); t.innerHTML = html; "
                           "return {script: t.content.querySelectorAll('script, img, [onerror]').length, "
                           "hrefs: [...t.content.querySelectorAll('a')].map(a => a.getAttribute('href'))}; }", html)
    assert holder["script"] == 0, html
    assert holder["hrefs"] == ["https://example.com/p.png", "https://example.com"], html  # the image is a link
    assert "&lt;script&gt;" in html


def test_a_streaming_chat_reply_reads_formatted_at_every_moment(page):
    page.evaluate(SAMPLER, [REPLY_TEXT, REPLY_TITLE, SAMPLE])
    box = page.locator("#message textarea")
    box.fill(CODE_PROMPT)
    box.press("Enter")
    page.wait_for_function(f"[...document.querySelectorAll({REPLY_TITLE!r})].some(t => t.innerText.includes({REPLIED!r}))",
                           timeout=120_000)
    page.wait_for_function("window.__samples.length && !window.__samples[window.__samples.length - 1].live")  # finished
    samples = page.evaluate(SAMPLES)
    check_samples(samples)
    streaming = [s for s in samples if s["live"]]
    assert len(streaming) >= 5, f"the live text was drawn in {len(streaming)} of {len(samples)} samples"
    assert any("PRE" in [b["tag"] for b in s["blocks"]] for s in streaming), "the reply's code streamed in a code block"
    assert not samples[-1]["live"], "the finished reply is Gradio's own"
    # The line beneath the reply keeps up with the text (Gradio alone redraws it once a second: at
    # most two values within any second).
    writing = [(s["t"], s["line"]) for s in streaming if s["line"].startswith("⏳")]
    most_in_a_second = max(len({line for t, line in writing if start <= t < start + 1000}) for start, _ in writing)
    assert most_in_a_second >= 3, f"the Writing line changed {most_in_a_second} times in its busiest second"


def test_compare_columns_stream_formatted_text_too(page):
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").wait_for()
    page.evaluate(SAMPLER, [COMPARE_TEXT.format(0), COMPARE_TITLE.format(0), SAMPLE])
    page.locator("#compare-prompt textarea").fill(CODE_PROMPT)
    page.locator("#compare-send").click()
    for column in (0, 1):  # each column's line beneath its reply is no longer "⏳ Writing…"
        page.wait_for_function(
            f"[...document.querySelectorAll({COMPARE_TITLE.format(column)!r})].some(t => t.innerText.trim() && !t.innerText.startsWith('⏳'))",
            timeout=180_000)
    samples = page.evaluate(SAMPLES)
    check_samples(samples)
    assert sum(s["live"] for s in samples) >= 5, "the column's text was drawn live"


def test_a_finished_reply_whose_box_comes_back_is_drawn_whole_at_once(page):
    """A redraw can bring back a finished reply's box after Gradio's copy replaced it (seen once in a
    Compare column of a full run): the page fills it with the whole text in the same moment, not
    from the first word again while it asks the server for the reply once more."""
    box = page.locator("#message textarea")
    box.fill(CODE_PROMPT)
    box.press("Enter")
    page.wait_for_function(f"[...document.querySelectorAll({REPLY_TITLE!r})].some(t => t.innerText.includes({REPLIED!r}))",
                           timeout=120_000)
    page.wait_for_function("!document.querySelector('#chatbot .live-reply')")  # Gradio's copy, for good
    drawn = page.evaluate("""async () => {
        const id = window.chatLive.latest();
        const box = document.createElement('div');
        box.className = 'live-reply stream-' + id;
        document.querySelector('#chatbot').append(box);
        await Promise.resolve();  // the page's observer of the document runs before this resumes
        const text = box.innerText;
        box.remove();
        return text;
    }""")
    assert "def add(a, b)" in drawn and drawn.rstrip().endswith("Done."), drawn
