// The engine line beneath the chat (#engine-status), kept current with a plain request to /status
// for the preset chosen in Settings. A Gradio timer did this before: each of its ticks made the page
// walk every component (about 150 ms of a phone's main thread) and the server queue an event.
// Asked only while the line is on screen and the page is visible; the first time as soon as it is.
(() => {
  const EVERY_MS = 2000;
  const LOOK_MS = 200; // until the line first appears
  let asking = false;
  let found = false;

  function statusUrl(preset) {
    const url = new URL("status", new URL(".", window.location.href));
    url.searchParams.set("preset", preset);
    return url;
  }

  async function refresh() {
    // The text Gradio drew for the Markdown: changing it in place keeps Gradio's own redraws working.
    const line = document.querySelector("#engine-status .md p");
    // checkVisibility: hidden in a closed tab or panel (browsers without it: assume shown).
    if (!line || document.hidden || asking || line.checkVisibility?.() === false) return;
    found = true;
    const box = document.querySelector("#preset input");
    if (box && box === document.activeElement) return; // a name half typed to filter the list
    asking = true;
    try {
      const preset = box?.value ?? "";
      const response = await fetch(statusUrl(preset), { cache: "no-store" });
      if (response.ok) {
        const text = (await response.json()).line;
        if (typeof text === "string" && line.isConnected && line.textContent !== text) line.textContent = text;
      }
    } catch {
      // The server is restarting or the network dropped: the next tick asks again.
    } finally {
      asking = false;
    }
  }

  (function tick() {
    refresh().finally(() => setTimeout(tick, found ? EVERY_MS : LOOK_MS));
  })();
})();
