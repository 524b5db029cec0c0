// The rule editor (agents/rule_form.py): the tool choice and "only when this tool is available" follow the server,
// the params rows follow the tool, the regex is checked as it is typed (by the server, as on save), and the placeholders the conditions make available are offered.
// Ours, served from static files (no CDN). The server validates everything again on save.
"use strict";
(function () {
  // The catalogue (per server id, its enabled tools and their arguments) is at the end of the page.
  let catalogue = { servers: {}, tools: {} };
  let lastParam = null;

  function serverId() {
    const select = document.getElementById("id_server");
    return select ? catalogue.servers[select.value] || "" : "";
  }

  function filterTools() {
    const select = document.getElementById("id_tool_name");
    if (!select) return;
    const chosen = serverId();
    select.querySelectorAll("optgroup").forEach((group) => {
      const match = !chosen || group.label === chosen;
      group.hidden = !match;
      group.disabled = !match;
    });
    const option = select.selectedOptions[0];
    if (option && option.parentElement.tagName === "OPTGROUP" && option.parentElement.disabled) {
      select.value = "";
    }
  }

  // "Only when this tool is available" offers the chosen server's tools (the form refuses another server's);
  // every server's list is on the conditions' block. Rebuilt when the server changes: the page comes with the
  // rule's server's tools (and a stored name none has, to be seen), which a first rebuild would drop.
  function filterAvailable() {
    const block = document.querySelector(".rule-when[data-server-tools]");
    const select = block && block.querySelector("select[name$='__tool_available']");
    if (!select) return;
    const tools = JSON.parse(block.dataset.serverTools || "{}");
    const chosen = serverId();
    const current = select.value;
    select.querySelectorAll("optgroup").forEach((group) => group.remove());
    const groups = chosen ? [[chosen, tools[chosen] || []]] : Object.entries(tools);
    groups.forEach(([label, names]) => {
      if (!names.length) return;
      const group = document.createElement("optgroup");
      group.label = label;
      names.forEach((name) => group.append(new Option(name, name)));
      select.append(group);
    });
    select.value = Array.from(select.options).some((option) => option.value === current) ? current : "";
  }

  function rebuildParams() {
    const body = document.querySelector(".rule-params-table tbody");
    const field = document.querySelector(".rule-params");
    const select = document.getElementById("id_tool_name");
    if (!body || !field || !select) return;
    const name = field.dataset.field;
    const args = ((catalogue.tools[serverId()] || {})[select.value]) || null;
    if (!args) return;
    const values = {};
    body.querySelectorAll("input.rule-param").forEach((input) => {
      values[input.name.slice((name + "__value__").length)] = input.value;
    });
    body.replaceChildren();
    Object.entries(args).forEach(([arg, spec]) => {
      const row = document.createElement("tr");
      const cellName = document.createElement("td");
      const hidden = Object.assign(document.createElement("input"), { type: "hidden", name: name + "__names", value: arg });
      const code = document.createElement("code");
      code.textContent = arg;
      cellName.append(hidden, code, spec.required ? " *" : "");
      const cellValue = document.createElement("td");
      const input = Object.assign(document.createElement("input"), {
        type: "text", size: 40, className: "rule-param", name: name + "__value__" + arg, value: values[arg] || "",
      });
      cellValue.append(input);
      const cellSpec = document.createElement("td");
      cellSpec.className = "help";
      cellSpec.textContent = (spec.type || "") + (spec.allowed ? " ∈ " + spec.allowed.join(", ") : "");
      row.append(cellName, cellValue, cellSpec);
      body.append(row);
    });
  }

  // The regex is checked by the server (DeterministicRuleAdmin.regex_check_view), with the validator the form runs
  // on save: a check in JavaScript's RegExp refused what Python takes ((?i) inline flags) and took what the server
  // refuses ((?<name>…)). Asked once typing pauses; an answer for a value since changed is dropped.
  let regexGroupNames = [];
  let regexTimer = null;

  function showRegexVerdict(out, verdict) {
    const said = out.dataset;  // the page's words, in the reader's language
    if (verdict.valid) {
      const groups = verdict.groups || [];
      out.textContent = "✓ " + (groups.length ? (said.groups || "groups:") + " " + groups.join(", ") : (said.valid || "valid"));
      out.className = "regex-check ok";
    } else {
      out.textContent = "✗ " + verdict.message;  // the server's words: the error the form shows on save
      out.className = "regex-check bad";
    }
  }

  function checkRegex() {
    const input = document.querySelector(".rule-regex");
    const out = document.querySelector(".regex-check");
    if (!input || !out) return;
    const value = input.value;
    if (!value || !catalogue.regex_check) {
      out.textContent = "";
      out.className = "regex-check";
      regexGroupNames = [];
      offerPlaceholders();
      return;
    }
    fetch(catalogue.regex_check + "?" + new URLSearchParams({ regex: value }), {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
      .then((verdict) => {
        if (input.value !== value) return;  // typed on since: its own check is on its way
        regexGroupNames = verdict.valid ? verdict.groups || [] : [];
        showRegexVerdict(out, verdict);
        offerPlaceholders();
      })
      .catch(() => {
        if (input.value !== value) return;
        out.textContent = "";  // no verdict rather than a guess: the server checks it again on save
        out.className = "regex-check";
      });
  }

  function checkRegexSoon() {
    clearTimeout(regexTimer);
    regexTimer = setTimeout(checkRegex, 250);
  }

  // The paths a JSON object holds, dotted (as PATH=value lines name them: {"order": {"id": 1}} holds order.id);
  // an empty object is a value of its own.
  function pathsOf(object, prefix) {
    return Object.entries(object).flatMap(([key, value]) => {
      const path = prefix ? prefix + "." + key : key;
      const nested = value !== null && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length;
      return nested ? pathsOf(value, path) : [path];
    });
  }

  // The keys a context or data condition names, as the form reads it: a JSON object's paths, or the KEY of each
  // KEY=value line (a line without "=" names none, and neither does JSON that does not read yet).
  function keysOf(selector) {
    const area = document.querySelector(selector);
    if (!area) return [];
    const text = area.value.trim();
    if (text.startsWith("{")) {
      try {
        const object = JSON.parse(text);
        return object !== null && typeof object === "object" && !Array.isArray(object) ? pathsOf(object, "") : [];
      } catch (error) {
        return [];
      }
    }
    return area.value.split("\n")
      .filter((line) => line.includes("="))
      .map((line) => line.slice(0, line.indexOf("=")).trim())
      .filter(Boolean);
  }

  // The rule as JSON stays open where it holds an edit that was not saved: a save refused for an error elsewhere
  // (the tool it names, say) folded it shut over what was pasted. (Django leaves a part holding its own error open.)
  function openEditedJson() {
    const area = document.querySelector("textarea.rule-json");
    const details = area && area.closest("details");
    const shown = area && area.form && area.form.elements["initial-" + area.name];
    if (!details || !shown) return;
    const text = (value) => value.replace(/\r\n?/g, "\n").trim();
    if (text(area.value) !== text(shown.value)) details.open = true;
  }

  function offerPlaceholders() {
    const chips = document.querySelector(".placeholder-chips");
    if (!chips) return;
    const names = ["{query}"]
      .concat(keysOf("textarea.rule-context").map((k) => "{context." + k + "}"))
      .concat(keysOf("textarea.rule-data").map((k) => "{data." + k + "}"))
      .concat(regexGroupNames.map((g) => "{match." + g + "}"));
    chips.querySelectorAll("button").forEach((b) => b.remove());
    names.forEach((text) => {
      const button = Object.assign(document.createElement("button"), { type: "button", textContent: text });
      button.dataset.placeholder = text;
      chips.append(button);
    });
  }

  document.addEventListener("focusin", (event) => {
    if (event.target.classList && event.target.classList.contains("rule-param")) lastParam = event.target;
  });
  document.addEventListener("click", (event) => {
    const text = event.target.dataset && event.target.dataset.placeholder;
    if (!text) return;
    const input = lastParam || document.querySelector("input.rule-param");
    if (!input) return;
    const at = input.selectionStart ?? input.value.length;
    input.value = input.value.slice(0, at) + text + input.value.slice(input.selectionEnd ?? at);
    input.focus();
  });

  document.addEventListener("DOMContentLoaded", () => {
    openEditedJson();
    const catalogueNode = document.getElementById("rule-tool-catalogue");
    if (!catalogueNode) return;
    catalogue = JSON.parse(catalogueNode.textContent);
    filterTools();
    checkRegex();
    offerPlaceholders();
    const server = document.getElementById("id_server");
    const tool = document.getElementById("id_tool_name");
    if (server) server.addEventListener("change", () => { filterTools(); filterAvailable(); rebuildParams(); });
    if (tool) tool.addEventListener("change", rebuildParams);
    document.querySelectorAll(".rule-regex").forEach((el) => el.addEventListener("input", checkRegexSoon));
    document.querySelectorAll("textarea.rule-context, textarea.rule-data").forEach((el) => el.addEventListener("input", offerPlaceholders));
  });
})();
