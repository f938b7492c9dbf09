"""The page's look: its theme, its own CSS, and attribute mends to Gradio's markup. The layout on
phones and the Stop button's visibility are the browser's business (no server round trip).
`demo.launch(theme=THEME, css=CSS, head=HEAD)` applies them. What they select of Gradio's own
markup is listed in chat/ui/gradio_internals.py (`MARKUP`, item 10) and tested against Gradio's page."""

import gradio as gr

# Gradio's default theme with the system's own fonts (its default downloads about 145 KB of web
# fonts before text settles) and colours that give small text at least 4.5:1 (WCAG AA; Gradio's
# grey hints, orange buttons and tabs, and red Stop measure 1.9 to 3.8 on white).
THEME = gr.themes.Default(
    font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
).set(
    body_text_color_subdued="*neutral_600",
    input_placeholder_color="*neutral_500",
    color_accent="*primary_700",
    button_primary_background_fill="*primary_700",
    button_primary_background_fill_hover="*primary_800",
    button_primary_background_fill_dark="*primary_700",
    button_primary_background_fill_hover_dark="*primary_800",
    button_cancel_background_fill="#dc2626",
    button_cancel_background_fill_hover="#b91c1c",
)

# Gradio 6.31 markup that axe-core reports, mended where it appears (attributes only; nothing
# moves, every control works as before). A MutationObserver, because Gradio renders a tab's
# contents, a chat's examples and each reply's stats line when they come.
HEAD = """<style>
/* On a phone the page's margins are narrow (in the head: the CSS above is scoped by Gradio to
   elements inside its container, and the margin is outside it). */
@media (max-width: 700px) { .gradio-container div.main.app { padding-left: 10px !important; padding-right: 10px !important; } }
/* The keyboard's way to the message box: the page's first stop, shown only while it has the focus. */
#skip-to-message { position: absolute; left: -10000px; top: 8px; z-index: 2000; padding: 8px 12px;
                   background: #fff; color: #1d4ed8; border: 2px solid #1d4ed8; border-radius: 6px; }
#skip-to-message:focus { left: 8px; }
</style>
<script>
(() => {
  const mend = () => {
    // A chat's example prompts: role="list" around buttons, which a list may not hold
    // (aria-required-children). A named group says the same without the broken promise.
    for (const el of document.querySelectorAll('.examples[role="list"]')) {
      el.setAttribute("role", "group");
      el.setAttribute("aria-label", "Example prompts");
    }
    // A reply's stats line: the whole line is the fold's button (role="button"); the arrow in it is
    // a second, unnamed button that does nothing of its own (button-name, nested-interactive).
    // Inert, a click on the arrow lands on the line, which opens and closes the fold as before.
    for (const el of document.querySelectorAll('[role="button"] .arrow button:not([inert])')) el.inert = true;
    // The message box's send arrow has no words (button-name).
    for (const el of document.querySelectorAll('#message button.submit-button:not([aria-label])')) {
      el.setAttribute("aria-label", "Send message");
    }
    // A link to the message box before anything else, for the keyboard (dozens of Tab presses
    // otherwise, past the tabs and the chat).
    if (document.body && !document.getElementById("skip-to-message")) {
      const skip = document.createElement("a");
      skip.id = "skip-to-message";
      skip.href = "#message";
      skip.textContent = "Skip to the message box";
      skip.addEventListener("click", (event) => {
        event.preventDefault();
        document.querySelector('[role="tab"][data-tab-id="chat"]:not([aria-selected="true"])')?.click();
        requestAnimationFrame(() => document.querySelector("#message textarea")?.focus());
      });
      document.body.prepend(skip);
    }
    // A dropdown's open list scrolls, so Chromium gives it a stop of its own in the Tab order: Tab
    // from the Preset box went into the list, which then closed, and the focus fell to the page.
    for (const el of document.querySelectorAll('ul[role="listbox"]:not([tabindex])')) el.tabIndex = -1;
    // Footer icons whose alt text repeats the word beside them (image-redundant-alt).
    for (const el of document.querySelectorAll('footer img[alt]:not([alt=""])')) {
      if (el.parentElement.textContent.includes(el.alt)) el.alt = "";
    }
  };
  // In the observer's own callback, which runs before the browser draws or does anything else: a
  // mend left for the next frame let an assistive tool that read the page in between meet the
  // unmended markup (axe did, once, on a reply's first stats line). The callback comes once per
  // batch of Gradio's changes, not once per change, and a mend is a few selector queries.
  new MutationObserver(mend).observe(document.documentElement, { childList: true, subtree: true });
  // Tab away from a dropdown (the Preset list) closes its list: Gradio's dropdown opens its list on
  // any key but Escape a moment after the key, so Tab (and the Shift of Shift+Tab) reopened it after
  // the focus had moved on, and it stayed open over the page. Keys that do not type are kept from
  // the dropdown; the focus moves on as usual and the list closes with the blur.
  const NOT_TYPING = new Set(["Tab", "Shift", "Control", "Alt", "Meta"]);
  document.addEventListener("keydown", (event) => {
    if (NOT_TYPING.has(event.key) && event.target.matches && event.target.matches('input[role="combobox"]')) {
      event.stopPropagation();
    }
  }, true);
  // Editing a sent message: Enter sends it, as in the message box (Shift+Enter for a new line).
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    if (!event.target.matches || !event.target.matches("#chatbot .user-row textarea")) return;
    const submit = document.querySelector('#chatbot button[aria-label="Submit"]');
    if (submit) {
      event.preventDefault();
      submit.click();
    }
  }, true);
})();
</script>"""

CSS = """
/* Room for the scrollbar from the start: without it the whole page jumps sideways when the chat
   grows taller than the window (Lighthouse measured a layout shift of 0.59 on a desktop). */
html { scrollbar-gutter: stable; }
/* A reply being written: the page renders it into its box (chat/ui/live_script.py). Gradio's own copy
   after the box, drawn now and then, shows only while the box is empty (until the first text comes,
   or where the page's script cannot follow the text). */
.live-reply:not(:empty) ~ * { display: none !important; }
.live-pending { position: absolute; width: 1px; height: 1px; overflow: hidden; clip-path: inset(50%); white-space: nowrap; }
/* The chat's settings sit to its right on a wide screen (they come first in the page so that the
   chat finds its inputs already made). */
#chat-layout { flex-wrap: nowrap; }
#chat-main { order: 1; }
#chat-settings { order: 2; }
#settings-open, #settings-header { display: none; }
/* On a phone the chat fills the screen; Settings opens the panel over it and Done closes it. */
@media (max-width: 700px) {
  #chat-layout { flex-wrap: wrap; }
  #chat-settings { display: none; }
  /* One column that scrolls: wrapped, a full-height column put the sampling settings in a second
     column off the screen's right edge. */
  #chat-settings.open { display: flex; position: fixed; inset: 0; z-index: 1000; overflow-y: auto;
                        flex-wrap: nowrap; padding: 12px; background: var(--background-fill-primary); }
  #chat-settings.open > * { flex-shrink: 0; min-width: 0 !important; }
  /* The screen's width for the page: narrow margins, and the tabs on one row (scrolling sideways
     within the row if they ever do not fit). */
  #title h2 { font-size: 1.25rem; }
  [role="tablist"] { flex-wrap: nowrap !important; overflow-x: auto; scrollbar-width: none; }
  [role="tab"] { padding: 0 10px !important; flex-shrink: 0; }
  #settings-open, #chat-settings.open #settings-header { display: flex; }
  #chat-header { flex-wrap: nowrap; align-items: flex-start; }
  /* Gradio draws the buttons a moment after the text: their room is kept from the start, so the
     chat does not move down when they come (a layout shift). The title wraps as it will beside
     Settings; the title's row, New chat, the message box and the Stop/Save row keep their height. */
  #title { max-width: calc(100% - 110px - var(--layout-gap)); }
  #chat-history { min-height: 29px; }
  #chat-header { min-height: 34px; }
  #chat-main:not(:has(#message)) > #chat-actions { margin-top: calc(52px + var(--layout-gap)); }
  #chat-actions { min-height: 26px; }
  /* Room for the message box on the first screen: the preset's description is on its card in
     Settings, and the chat takes what is left. */
  #title p { display: none; }
  #chatbot { min-height: 240px !important; height: calc(100svh - 330px) !important; }
  /* The saved chats sit above the chat here: a short list that scrolls, beside a small New chat. */
  #new-chat { min-height: 0; padding: 4px 12px; }
  #saved-chats { max-height: 5.5em; overflow-y: auto; }
}
/* Gradio draws the chat a moment after the message box (the chat's script comes later): until it
   comes, the chat's column keeps its room, so the message box does not jump down the screen when it
   does (Lighthouse measured a layout shift of 0.17 on the phone profile). */
#chat-main > .column > .row > .column:not(#chat-history):not(:has(#chatbot)) { min-height: 420px; }
@media (max-width: 700px) {
  #chat-main > .column > .row > .column:not(#chat-history):not(:has(#chatbot)) {
    min-height: calc(max(240px, 100svh - 330px) + var(--layout-gap) + 2px);  /* the chat, and its examples' row */
  }
}
/* Stop only while a reply is on its way: the message box is disabled, or a line beneath a reply
   is still pending (waiting for the engine, writing: Gradio draws a spinner in it), or the reply
   this page began is still being written over its socket (live.js's data-writing: Gradio's own
   states can end first). Not every aria-busy line: Gradio marks any line without a body busy, a
   finished reply's error line too, and Stop showed for good after one. */
#stop, #compare-stop { display: none; }
html[data-writing] #stop,
.gradio-container:has(#message textarea:disabled) #stop,
.gradio-container:has(#chatbot [aria-busy="true"] .loading-spinner) #stop,
.gradio-container:has([id^="compare-chat-"] [aria-busy="true"] .loading-spinner) #compare-stop { display: inline-flex; }
#chat-actions { align-items: center; }
/* The buttons beneath the chat's messages (Retry, Undo, Edit, Copy) wait until the turn is over and
   no reply is being written (a retry's, an edit's): the page shows a reply's stats a moment before
   the turn's last update, which holds the chat these buttons start from, and an edit made in that
   moment lost its reply (a fresh CI run). Hidden, not removed: nothing moves when they come back. */
.gradio-container:has(#message textarea:disabled) #chatbot .message-buttons,
.gradio-container:has(#chatbot [aria-busy="true"] .loading-spinner) #chatbot .message-buttons { visibility: hidden; }
/* Gradio's send arrow sends whatever the box holds, shut or not (live.js shuts it while a retry's
   reply is written): it goes with the box. */
#message:has(textarea:disabled) button.submit-button { visibility: hidden; }
/* No saved chats yet: Gradio first draws an empty row there and then removes it, moving the chat
   (a layout shift on every first visit); an empty list takes no room at all. */
#saved-chats:not(:has(td)) { display: none; }
/* An empty bar chart (nothing compared yet) still draws an empty, unnamed mark group (axe's
   svg-img-alt); it shows nothing, so it is hidden until its bars come. */
.vega-embed g[role="graphics-symbol"]:empty { display: none; }
/* Read-only tables (chat/ui/tables.py): a table on a wide screen, one card per row on a phone, each
   value beside its column's name, so that no column needs sideways scrolling. */
.plain-table { width: 100%; border-collapse: collapse; font-size: var(--text-md); color: var(--body-text-color); }
.plain-table th, .plain-table td { padding: 6px 10px; text-align: left; vertical-align: top;
                                   border-bottom: 1px solid var(--border-color-primary); }
.plain-table th { font-weight: 600; background: var(--background-fill-secondary); }
.plain-table td.number { text-align: right; font-variant-numeric: tabular-nums; }
.plain-table tr.empty td { color: var(--body-text-color-subdued); text-align: left; }
@media (max-width: 700px) {
  .plain-table thead { display: none; }
  .plain-table, .plain-table tbody, .plain-table tr { display: block; }
  .plain-table tr { border: 1px solid var(--border-color-primary); border-radius: var(--radius-md);
                    padding: 4px 0; margin-bottom: 8px; }
  .plain-table td, .plain-table td.number { display: flex; justify-content: space-between; gap: 12px; border: none;
                                            padding: 3px 10px; text-align: right; overflow-wrap: anywhere; }
  .plain-table td::before { content: attr(data-label); flex-shrink: 0; max-width: 55%; text-align: left;
                            color: var(--body-text-color-subdued); }
  .plain-table td:empty { display: none; }
}
/* A chart drawn twice (the Leaderboard's, chat/charts.py): shrunk to a phone's width the wide
   drawing's text would be 5 px; the phone gets the narrow drawing, whose text stays 12 px. */
.chart-narrow { display: none; }
@media (max-width: 700px) { .chart-wide { display: none; } .chart-narrow { display: block; } }
/* The Monitor's one legend for its six charts (chat/ui/monitor_tab.py) and the charts' titles. */
.chart-legend { display: flex; flex-wrap: wrap; gap: 4px 18px; margin: 0; padding: 0; list-style: none; }
.chart-legend li { display: inline-flex; align-items: center; gap: 6px; }
.chart-legend .swatch { display: inline-block; width: 20px; height: 4px; border-radius: 2px; }
#monitor-charts [data-testid="block-info"] { color: var(--body-text-color); font-weight: 600; }
/* Readers who ask for less motion (a system setting) get none: no fades, no pulsing borders.
   Transitions take no time at all, not a short time: a transition of any length starts only at the
   next frame the browser draws, and until then the element keeps its old look, so a Download
   button just enabled kept its disabled one (opacity 0.5, text 3.28:1 on its grey) for as long as
   the page was busy drawing the Leaderboard's table and chart, and axe read it so. A transition of
   0 s is none: the new look applies at once. */
@media (prefers-reduced-motion: reduce) {
  *, *::before, *::after { animation-duration: 0.01ms !important; animation-iteration-count: 1 !important;
                           transition-duration: 0s !important; transition-delay: 0s !important;
                           scroll-behavior: auto !important; }
}
"""
