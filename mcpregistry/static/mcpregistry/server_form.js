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

  document.addEventListener("DOMContentLoaded", () => {
    apply();
    const transport = document.getElementById("id_transport");
    if (transport) transport.addEventListener("change", apply);
  });
})();
