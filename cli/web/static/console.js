// pylog console: refresh the page's content in place every data-refresh seconds (the server
// sends the content alone for the header X-Console-Fragment), pausing while a field has focus;
// when a refresh fails, keep what is shown and say since when it is stale.
(function () {
  "use strict";
  const main = document.getElementById("content");
  const status = document.getElementById("status");
  if (!main || !main.dataset.refresh) return;
  const every = Math.max(1, parseFloat(main.dataset.refresh)) * 1000;
  let stale = null;

  function say(text, bad) {
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("stale", bad);
  }

  async function refresh() {
    const active = document.activeElement;
    if (active && main.contains(active) && active.matches("input, select, textarea")) return;
    try {
      const reply = await fetch(window.location.href, {
        headers: { "X-Console-Fragment": "1" },
        cache: "no-store",
        signal: AbortSignal.timeout(every * 4),
      });
      main.innerHTML = await reply.text();
      stale = null;
      say("updated " + new Date().toLocaleTimeString(), !reply.ok);
    } catch (error) {
      stale = stale || new Date();
      say("console unreachable since " + stale.toLocaleTimeString() + ": showing what it last said", true);
    }
  }

  window.setInterval(refresh, every);
})();
