// The MCP server form shows what the chosen transport uses: stdio its command, arguments, folder, environment
// and secret environment; Streamable HTTP and SSE their URL and secret headers; local tools their dotted paths.
// Hidden fields keep their values; a part with an error to fix is never hidden. Ours, served from static files
// (no CDN).
"use strict";
(function () {
  const KIND = { stdio: "stdio", streamable_http: "http", sse: "http", local: "local" };
  const ROWS = { command: ["stdio"], cwd: ["stdio"], new_env: ["stdio"], new_headers: ["http"] };

  function apply() {
    const transport = document.getElementById("id_transport");
    if (!transport) return;
    const kind = KIND[transport.value] || "stdio";
    const hasError = (el) => el.querySelector(".errorlist") !== null;
    document.querySelectorAll("fieldset[class*='server-transport-']").forEach((fieldset) => {
      fieldset.hidden = !fieldset.classList.contains("server-transport-" + kind) && !hasError(fieldset);
    });
    Object.entries(ROWS).forEach(([field, kinds]) => {
      document.querySelectorAll(".form-row.field-" + field).forEach((row) => {
        row.hidden = !kinds.includes(kind) && !hasError(row);
      });
    });
  }

  // Discover tools and Check health wait for the server: once one is sent, both buttons are disabled (a second
  // click queued a second discovery), and the discovery says how long it may take (its text is the page's, in the
  // reader's language). A page come back to from the next one gets its buttons back.
  function busyButtons() {
    const buttons = [...document.querySelectorAll(".server-tools button[type=submit]")];
    const restore = buttons.map((button) => [button, button.textContent]);
    buttons.forEach((button) => {
      button.form.addEventListener("submit", (event) => {
        if (buttons.some((b) => b.disabled)) {
          event.preventDefault();
          return;
        }
        buttons.forEach((b) => {
          b.disabled = true;
        });
        if (button.dataset.busy) button.textContent = button.dataset.busy;
        button.setAttribute("aria-busy", "true");
      });
    });
    window.addEventListener("pageshow", (event) => {
      if (!event.persisted) return;
      restore.forEach(([button, text]) => {
        button.disabled = false;
        button.textContent = text;
        button.removeAttribute("aria-busy");
      });
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    apply();
    busyButtons();
    const transport = document.getElementById("id_transport");
    if (transport) transport.addEventListener("change", apply);
  });
})();
