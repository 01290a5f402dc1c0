// Progressive enhancement only: without this file every form posts and the page reloads.
// With it, a DLQ action removes its row in place and a mailbox action reloads the table.
"use strict";
(function () {
  const flash = document.getElementById("flash");
  function say(text, bad) {
    if (!flash) return;
    flash.textContent = text;
    flash.hidden = false;
    flash.classList.toggle("error", !!bad);
  }
  document.addEventListener("submit", async function (event) {
    const form = event.target;
    const mode = form.dataset.inplace;
    if (!mode) return;
    event.preventDefault();
    const button = form.querySelector("button");
    if (button) button.disabled = true;
    let answer = {};
    let response;
    try {
      response = await fetch(form.action, {
        method: "POST",
        body: new URLSearchParams(new FormData(form)),
        headers: { "Accept": "application/json" },
        credentials: "same-origin",
      });
      answer = await response.json().catch(() => ({}));
    } catch (err) {
      say("The console did not answer: " + err, true);
      if (button) button.disabled = false;
      return;
    }
    if (!response.ok) {
      say(answer.message || ("Refused (" + response.status + ")"), true);
      if (button) button.disabled = false;
      return;
    }
    say(answer.message || "Done.", false);
    if (mode === "reload") { window.location.reload(); return; }
    const row = form.closest("tr");
    if (row) {
      row.classList.add("leaving");
      setTimeout(() => row.remove(), 400);
    }
    const count = document.getElementById("dlq-count");
    if (count && /^\d+$/.test(count.textContent)) {
      count.textContent = String(Math.max(0, Number(count.textContent) - 1));
    }
  });
})();
