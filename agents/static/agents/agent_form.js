// The agent form shows the settings of the chosen mode: a Flow agent runs its graph (no model loop), a ReAct
// agent its model. Hidden settings keep their values. Ours, served from static files (no CDN).
"use strict";
(function () {
  function apply() {
    const mode = document.getElementById("id_mode");
    if (!mode) return;
    document.querySelectorAll("fieldset.agent-mode-flow").forEach((el) => { el.hidden = mode.value !== "flow"; });
    document.querySelectorAll("fieldset.agent-mode-react").forEach((el) => { el.hidden = mode.value === "flow"; });
  }
  document.addEventListener("DOMContentLoaded", () => {
    apply();
    const mode = document.getElementById("id_mode");
    if (mode) mode.addEventListener("change", apply);
  });
})();
