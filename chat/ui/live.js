// Live reply text: follow replies over the page's WebSocket (/chat, "watch") and render each one as
// Markdown, whole, into its box (<div class="live-reply stream-ID">, put there by the server).
// chat/live.py and chat/ui/live_script.py explain why. window.chatLive.begin starts a typed message's reply (chat/live.py),
// latest names it for Stop, turnOver says the typed turn has ended; render and connected are for the browser tests.
(() => {
  const replies = new Map(); // id -> {deltas: string[], line: string | undefined, done: boolean, began?: true, goneAt?: number}
  let latestBegun = ""; // the id of the reply this page started last
  let socket = null;
  let retry = 0;
  let parser = null;
  const GIVE_UP = 3; // failed connections in a row after which the page shows Gradio's copy instead
  const FORGET_MS = 30000; // how long a finished reply's text is kept after its box has gone

  // --- Markdown, as Gradio's chat renders it (marked 12: GitHub-flavoured, line breaks kept) ----

  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escape = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
  // Addresses a reply may link to; anything else (javascript:, data:) stays text.
  const SAFE_HREF = /^(https?:|mailto:|#|\/(?!\/))/i;

  function link(href, title, text) {
    if (!href || !SAFE_HREF.test(href)) return text;
    const titled = title ? ` title="${escape(title)}"` : "";
    return `<a href="${escape(href)}"${titled} target="_blank" rel="noopener noreferrer">${text}</a>`;
  }

  function markdown() {
    if (!parser && window.marked && window.marked.Marked) {
      parser = new window.marked.Marked({
        gfm: true,
        breaks: true,
        renderer: {
          // A reply's HTML is shown as text while it streams (Gradio sanitises it once it is done).
          html: (html) => escape(html),
          code(code, info) {
            const language = (info || "").match(/\S*/)[0];
            const kind = language ? ` class="language-${escape(language)}"` : "";
            return `<div class="code_wrap"><pre><code${kind}>${escape(code.replace(/\n$/, ""))}\n</code></pre></div>\n`;
          },
          link,
          image: (href, title, text) => link(href, title, text), // never fetched by itself (messages.shown_text)
        },
      });
    }
    return parser;
  }

  // The text so far, less what could still turn into other syntax (shown once it cannot):
  // a last line that may be the start of a fence, a list item, a heading's underline or a table
  // row; a table not yet followed by its delimiter row; an unfinished link; a half-typed marker;
  // and with an unclosed ** or ` closed for now, so that neither shows as text. Gradio's copy of
  // the text is settled by the same steps in chat/ui/messages.py (settled_copy): change both
  // (tests/test_browser_live.py compares them).
  const FENCE = /^ {0,3}(`{3,}|~{3,})/;
  // The pattern of chat/ui/messages.py, which chat/ui/live_script.py puts in place of this one.
  const MAY_BECOME = /MAY_BECOME/;
  const MAY_CLOSE_FENCE = /^ {0,3}(`{1,}|~{1,})\s*$/;
  const TABLE_DELIMITER = /^ {0,3}\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  function settled(text) {
    const lines = text.split("\n");
    let fenced = false;
    for (const line of lines.slice(0, -1)) if (FENCE.test(line)) fenced = !fenced;
    const last = lines.length - 1;
    if (fenced) {
      if (MAY_CLOSE_FENCE.test(lines[last])) lines[last] = "";
      return lines.join("\n");
    }
    if (MAY_BECOME.test(lines[last])) lines[last] = "";
    // Table rows at the end are held back until their delimiter row is complete.
    const end = lines[last] === "" ? last : last + 1;
    let start = end;
    while (start > 0 && lines[start - 1].trimStart().startsWith("|")) start -= 1;
    if (start < end && (end - start < 2 || !TABLE_DELIMITER.test(lines[start + 1]))) lines.splice(start, end - start);
    // In the last line: an unfinished [link](address, a half-typed marker, and an open ` or **.
    let tail = lines.pop() ?? "";
    tail = tail.replace(/\[[^\]\n]*(\]\([^)\s]*)?$/, "").replace(/[*_`~]+$/, "");
    const open = openCode(tail);
    if (open) tail += open;
    else if ((tail.replace(/(`+)[^`]*?\1/g, "").match(/\*\*/g) || []).length % 2) tail = tail.trimEnd() + "**";
    lines.push(tail);
    return lines.join("\n");
  }

  // The backticks that would close a code span left open in `line` ("" when none is open).
  function openCode(line) {
    let open = "";
    for (const [run] of line.matchAll(/`+/g)) {
      if (!open) open = run;
      else if (run === open) open = "";
    }
    return open;
  }

  function render(text) {
    const md = markdown();
    return md ? md.parse(settled(text)) : null;
  }

  // --- boxes ------------------------------------------------------------------------------

  function streamOf(box) {
    for (const name of box.classList) if (name.startsWith("stream-")) return name.slice(7);
    return null;
  }

  // Put `html` into the box, keeping every top-level block that did not change (so text already
  // shown stays where it is, and a selection in it survives).
  function patch(box, html) {
    const fresh = document.createElement("template");
    fresh.innerHTML = html;
    const now = Array.from(box.children);
    const next = Array.from(fresh.content.children);
    let same = 0;
    while (same < now.length && same < next.length && now[same].outerHTML === next[same].outerHTML) same += 1;
    for (const node of now.slice(same)) node.remove();
    box.append(...next.slice(same));
  }

  function draw(id) {
    const reply = replies.get(id);
    if (!reply || !reply.deltas.length || retry >= GIVE_UP) return;
    const boxes = document.querySelectorAll(`.live-reply.stream-${CSS.escape(id)}`);
    if (!boxes.length) return;
    const text = reply.deltas.join("");
    const html = render(text);
    if (html === null) return; // the parser is not loaded: Gradio's copy of the text shows instead
    for (const box of boxes) {
      if (box.dataset.drawn === String(reply.deltas.length)) continue;
      if (!box.childNodes.length && !reply.began && text.length < copyLength(box)) continue;
      patch(box, html);
      box.dataset.drawn = String(reply.deltas.length);
    }
    if (reply.line === undefined) return;
    for (const line of document.querySelectorAll(`.live-line.stream-${CSS.escape(id)}`)) {
      if (line.textContent !== reply.line) line.textContent = reply.line;
    }
  }

  // How much text Gradio's copy beside an empty box shows. A reply this page follows rather than
  // started (a Compare column's) is followed from the first redraw that shows its box, and the
  // socket replays its text a delta at a time over a frame or two: drawn before it has caught up
  // with the copy, a column's text would shrink for a frame ("The lighthouse", then "The").
  function copyLength(box) {
    let length = 0;
    for (let node = box.nextElementSibling; node; node = node.nextElementSibling) {
      if (!node.querySelector(".live-pending")) length += node.textContent.trim().length;
    }
    return length;
  }

  // New text is drawn once per frame, however many deltas arrive in it.
  const due = new Set();
  let frame = 0;
  function later(id) {
    due.add(id);
    if (!frame) {
      frame = requestAnimationFrame(() => {
        frame = 0;
        for (const each of due) draw(each);
        due.clear();
      });
    }
  }

  // --- the socket ---------------------------------------------------------------------------

  function url() {
    const base = new URL(".", window.location.href);
    base.protocol = base.protocol === "https:" ? "wss:" : "ws:";
    return new URL("chat", base).href;
  }

  // While the reply this page began is being written, the page shows Stop (chat/ui/style.py), not
  // only while Gradio's turn shows it busy: a full run on a busy machine wrote a whole reply over
  // the socket with Stop hidden.
  function writing() {
    const reply = replies.get(latestBegun);
    document.documentElement.toggleAttribute("data-writing", Boolean(reply && !reply.done && retry < GIVE_UP));
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function connect() {
    socket = new WebSocket(url());
    socket.onopen = () => {
      retry = 0;
      for (const [id, reply] of replies) {
        // A reply this page started is its socket's: taken back ("resume"), or the server ends it soon.
        if (!reply.done) send({ type: reply.began ? "resume" : "watch", id, after: reply.deltas.length - 1 });
        later(id);
      }
    };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      const reply = replies.get(message.id);
      if (!reply) return;
      if (message.type === "delta" && message.index === reply.deltas.length) {
        reply.deltas.push(message.text);
        if (message.line !== undefined) reply.line = message.line;
        later(message.id);
      } else if (message.type === "done" || message.type === "error") {
        reply.done = true;
        writing();
      }
    };
    socket.onclose = () => {
      socket = null;
      if ([...replies.values()].some((reply) => !reply.done)) {
        retry += 1;
        if (retry === GIVE_UP) {
          // Gradio's copy of the text shows until the socket is back (its redraws keep it current).
          for (const box of document.querySelectorAll(".live-reply")) {
            box.replaceChildren();
            delete box.dataset.drawn;
          }
          writing();
        }
        setTimeout(connect, Math.min(5000, 250 * 2 ** retry));
      }
    };
  }

  // A typed message: its reply starts over the socket now, and the Gradio turn sent with the
  // returned inputs (the reply's id last) follows it (chat/live.py). `inputs` are the
  // turn's: the message, the chat, the preset, the system prompt, the knobs named in `knobs`, and
  // a slot for the id (left empty when the socket is not open).
  function begin(inputs, knobs) {
    turnOpen = true;
    const values = inputs.slice(0, -1);
    const [message, history, preset, systemPrompt, ...knobValues] = values;
    if (!socket || socket.readyState !== WebSocket.OPEN || retry >= GIVE_UP || !String(message ?? "").trim()) {
      return [...values, ""];
    }
    const bytes = crypto.getRandomValues(new Uint8Array(16)); // randomUUID needs https
    const id = "live-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
    replies.set(id, { deltas: [], done: false, began: true });
    latestBegun = id;
    writing();
    const sampling = Object.fromEntries(knobs.map((name, i) => [name, knobValues[i]]));
    send({ type: "begin", id, message, history: history || [], preset, system_prompt: systemPrompt, sampling });
    return [...values, id];
  }

  // The message box takes no message while a reply in the chat is being written (a pending line
  // beneath it: Gradio draws a spinner in it; not every aria-busy line, which Gradio sets on any line
  // without a body, a finished reply's error line too). A typed turn shuts the box itself, and opens
  // it once the page counts the turn as over (turnOver, chat/ui/chat_tab.py), not when its reply
  // ends; Retry, Edit and the examples run Gradio's own events, which leave it open, and a message
  // sent during one wrote a second reply into the chat at the same time and left the first one
  // unfinished. Only a box shut here is opened here, and nothing is done while a typed turn is open
  // (style.py hides the send arrow with the shut box). A pending line changes as it is written (its
  // seconds, its tokens); one unchanged for STALE_MS is left from a turn that broke (a worker gone
  // mid-reply) and holds nothing until it changes again (a reply that waited that long for a free
  // slot, then writes). Gradio changes a line's text in place, which the observer below does not
  // see: the clock looks every few seconds.
  const PENDING = '#chatbot [aria-busy="true"] .loading-spinner';
  const STALE_MS = window.chatStaleMs || 30000; // tests set it shorter
  const lineSeen = new WeakMap(); // a pending line -> {text, at}: its text, and when it last changed
  let heldBox = null;
  let turnOpen = false;
  function aReplyIsWritten() {
    const now = Date.now();
    let found = false;
    for (const spinner of document.querySelectorAll(PENDING)) {
      const line = spinner.closest('[aria-busy="true"]');
      const seen = lineSeen.get(line);
      if (!seen || seen.text !== line.textContent) lineSeen.set(line, { text: line.textContent, at: now });
      else if (now - seen.at > STALE_MS) continue;
      found = true;
    }
    return found;
  }
  function holdBoxWhileWriting() {
    if (turnOpen) return;
    const box = document.querySelector("#message textarea");
    const busy = aReplyIsWritten();
    if (busy && box && !box.disabled) {
      box.disabled = true;
      heldBox = box;
    } else if (!busy && heldBox) {
      heldBox.disabled = false;
      heldBox = null;
    }
  }
  setInterval(holdBoxWhileWriting, Math.min(5000, STALE_MS / 2));

  // Gradio made or remade boxes: follow their replies, and fill them at once (before the page is
  // painted, so a redraw never shows an empty box).
  function follow() {
    holdBoxWhileWriting();
    const live = new Set();
    for (const box of document.querySelectorAll(".live-reply")) {
      const id = streamOf(box);
      if (!id) continue;
      live.add(id);
      if (!replies.has(id)) {
        replies.set(id, { deltas: [], done: false });
        if (!socket) connect();
        else send({ type: "watch", id, after: -1 });
      }
      if (box.dataset.drawn === undefined) draw(id);
    }
    // A redraw's line beneath a reply is as old as the redraw: the page's is newer.
    for (const line of document.querySelectorAll(".live-line")) {
      const reply = replies.get(streamOf(line));
      if (reply && reply.line !== undefined && line.textContent !== reply.line) line.textContent = reply.line;
    }
    // A finished reply whose box has gone is drawn for good by Gradio; it is kept a while, because a
    // redraw can bring its box back (a full run saw it in a Compare column), which is then filled
    // with the whole text at once rather than followed again from its first word.
    const now = Date.now();
    for (const [id, reply] of replies) {
      if (live.has(id) || !reply.done) delete reply.goneAt;
      else if (reply.goneAt === undefined) reply.goneAt = now;
      else if (now - reply.goneAt > FORGET_MS) replies.delete(id);
    }
  }

  const connected = () => socket !== null && socket.readyState === WebSocket.OPEN; // for the browser tests
  const latest = () => latestBegun; // the reply the page's Stop stops (chat/ui/chat_tab.py)
  function turnOver() { // a typed turn has ended (chat/ui/chat_tab.py)
    turnOpen = false;
    holdBoxWhileWriting();
  }
  window.chatLive = { render, settled, begin, connected, latest, turnOver };
  new MutationObserver(follow).observe(document.documentElement, { childList: true, subtree: true });
  connect(); // now, so that the first reply's text is drawn from its first piece
})();
