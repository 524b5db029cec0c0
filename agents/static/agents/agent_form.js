// The agent form shows the settings of the chosen mode: a Flow agent runs its graph (no model loop), a ReAct
// agent its model; and of the chosen provider: Bedrock signs with the worker's AWS credentials and the offline model
// calls nothing, so neither is given a model API key (a save refuses one), and the offline model has no model id.
// Hidden settings keep their values; without JavaScript every setting shows. Ours, served from static files (no CDN).
"use strict";
(function () {
  // The provider's own inputs, by the row's field name: shown only for the providers listed.
  const BY_PROVIDER = {
    new_model_api_key: ["openai_compatible", "scripted"],
    model_api_key_from_env: ["openai_compatible", "scripted"],
    model_id: ["openai_compatible", "bedrock", "scripted"],
  };

  const FLOW_PLACEHOLDER = "flow.mcp_id=sds-company-data";

  function apply() {
    const mode = document.getElementById("id_mode");
    if (!mode) return;
    document.querySelectorAll("fieldset.agent-mode-flow").forEach((el) => { el.hidden = mode.value !== "flow"; });
    document.querySelectorAll("fieldset.agent-mode-react").forEach((el) => { el.hidden = mode.value === "flow"; });
    // A flow reads only its options (flow.KEY) of the model parameters: the box's example says so, not a model's.
    const params = document.querySelector('textarea[name="model_params__lines"]');
    if (params) {
      if (params.dataset.modelPlaceholder === undefined) params.dataset.modelPlaceholder = params.placeholder;
      params.placeholder = mode.value === "flow" ? FLOW_PLACEHOLDER : params.dataset.modelPlaceholder;
    }
    const provider = document.getElementById("id_model_provider");
    if (!provider) return;
    Object.entries(BY_PROVIDER).forEach(([name, providers]) => {
      document.querySelectorAll(`.form-row.field-${name}`).forEach((row) => {
        // A row with an error stays shown, so that what refused the page can be read and mended.
        row.hidden = !providers.includes(provider.value) && !row.classList.contains("errors");
      });
    });
  }
  document.addEventListener("DOMContentLoaded", () => {
    apply();
    ["id_mode", "id_model_provider"].forEach((id) => {
      const input = document.getElementById(id);
      if (input) input.addEventListener("change", apply);
    });
  });
})();
