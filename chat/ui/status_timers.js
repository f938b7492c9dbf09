// Gradio's progress indicator (its StatusTracker) counts a wait's seconds in a loop that asks for
// every animation frame until the wait ends. The one shown while the page loads is removed from the
// page before its wait ends (Gradio 6.31), so its loop never ended: every open page drew 60 frames a
// second for as long as it stayed open (~0.1 s of CPU a second on a 2-core EPYC; a laptop's fan, a
// phone's battery). Here a frame that the indicator's own code asks for runs only while an indicator
// is on screen; otherwise its loop ends, as it would have once its wait ended. The app hides every
// event's indicator but a few, so as a rule none is. Runs before Gradio's scripts (chat/ui/page_shell.py).
(() => {
  const INDICATOR = /\/statustracker-[\w-]+\.js:/;
  const SHOWN = ".wrap:is(.default, .center):not(.hide)";
  const request = window.requestAnimationFrame.bind(window);

  function askForFrame(callback) {
    const stack = (new Error().stack ?? "").split("\n");
    const caller = stack[stack.findIndex((line) => line.includes("askForFrame")) + 1] ?? "";
    if (!INDICATOR.test(caller)) return request(callback);
    return request((time) => {
      if (document.querySelector(SHOWN)) callback(time);
    });
  }

  window.requestAnimationFrame = askForFrame;
})();
