// Live reply text: follow replies over the page's WebSocket (/chat, "watch") and show the text that
// arrived since Gradio last redrew the reply. chat/ui/live.py explains why; the server marks where
// the text goes with <span class="live-reply stream-ID after-N"></span>, N being how many deltas the
// text Gradio drew already holds (class names, because Gradio's sanitiser drops data- attributes).
(() => {
  const replies = new Map(); // id -> {deltas: string[], done: boolean}
  let socket = null;
  let retry = 0;

  function url() {
    const base = new URL(".", window.location.href);
    base.protocol = base.protocol === "https:" ? "wss:" : "ws:";
    return new URL("chat", base).href;
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function connect() {
    socket = new WebSocket(url());
    socket.onopen = () => {
      retry = 0;
      for (const [id, reply] of replies) {
        if (!reply.done) send({ type: "watch", id, after: reply.deltas.length - 1 });
      }
    };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      const reply = replies.get(message.id);
      if (!reply) return;
      if (message.type === "delta" && message.index === reply.deltas.length) {
        reply.deltas.push(message.text);
        draw(message.id);
      } else if (message.type === "done" || message.type === "error") {
        reply.done = true;
      }
    };
    socket.onclose = () => {
      socket = null;
      if ([...replies.values()].some((reply) => !reply.done)) {
        retry += 1;
        setTimeout(connect, Math.min(5000, 250 * 2 ** retry));
      }
    };
  }

  function marks(span) {
    let id = null;
    let after = 0;
    for (const name of span.classList) {
      if (name.startsWith("stream-")) id = name.slice(7);
      else if (name.startsWith("after-")) after = Number(name.slice(6));
    }
    return { id, after };
  }

  function draw(id) {
    const reply = replies.get(id);
    for (const span of document.querySelectorAll(`.live-reply.stream-${CSS.escape(id)}`)) {
      const text = reply.deltas.slice(marks(span).after).join("");
      if (span.textContent !== text) span.textContent = text;
    }
  }

  function follow() {
    const live = new Set();
    for (const span of document.querySelectorAll(".live-reply")) {
      const { id } = marks(span);
      if (!id) continue;
      live.add(id);
      if (!replies.has(id)) {
        replies.set(id, { deltas: [], done: false });
        if (!socket) connect();
        else send({ type: "watch", id, after: -1 });
      }
      draw(id);
    }
    for (const [id, reply] of replies) {
      if (reply.done && !live.has(id)) replies.delete(id); // drawn for good by Gradio
    }
  }

  new MutationObserver(follow).observe(document.documentElement, { childList: true, subtree: true });
})();
