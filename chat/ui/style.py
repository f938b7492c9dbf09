"""The page's own CSS: the layout on phones and the Stop button's visibility are the browser's
business (no server round trip). `demo.launch(css=CSS)` applies it."""

CSS = """
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
  #chat-settings.open { display: flex; position: fixed; inset: 0; z-index: 1000; overflow-y: auto;
                        padding: 12px; background: var(--background-fill-primary); }
  #settings-open, #chat-settings.open #settings-header { display: flex; }
  #chat-header { flex-wrap: nowrap; align-items: flex-start; }
}
/* Stop only while a reply is on its way: the message box is disabled, or a line beneath a reply
   is still busy (waiting for the engine, writing). */
#stop, #compare-stop { display: none; }
.gradio-container:has(#message textarea:disabled) #stop,
.gradio-container:has(#chatbot [aria-busy="true"]) #stop,
.gradio-container:has([id^="compare-chat-"] [aria-busy="true"]) #compare-stop { display: inline-flex; }
#chat-actions { align-items: center; }
"""
