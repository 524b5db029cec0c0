// An API key's add form keeps its token across the back button: the page is never cached, so going back makes
// the form anew with a fresh token (Chromium refills what was typed, not a hidden field), and saving it again
// would issue a second key. The token sent is kept in this page's history entry and put back when the page is
// made again from that entry. Ours, served from static files (no CDN).
"use strict";
(function () {
  document.addEventListener("DOMContentLoaded", () => {
    const input = document.querySelector("input[name='form_token']");
    if (!input || !input.form) return;
    const kept = history.state && history.state.issueToken;
    if (kept) input.value = kept;
    input.form.addEventListener("submit", () => {
      history.replaceState({ ...(history.state || {}), issueToken: input.value }, "");
    });
  });
})();
