// An eval set's page lists its cases one line each: the case's key, question and type, with a button that opens
// the case's fields. A case with an error to fix, and a case just added, stay open. Ours, served from static files
// (no CDN); the words come from the page (the reader's language).
"use strict";
(function () {
  function labels() {
    const node = document.getElementById("eval-case-labels");
    return node ? JSON.parse(node.textContent) : { open: "Edit", close: "Close", openAll: "Open all", closeAll: "Close all" };
  }

  function setOpen(form, open, words) {
    form.querySelectorAll(":scope > fieldset").forEach((fieldset) => {
      fieldset.hidden = !open;
    });
    const button = form.querySelector(":scope > h3 .eval-case-toggle");
    if (button) {
      button.textContent = open ? words.close : words.open;
      button.setAttribute("aria-expanded", open ? "true" : "false");
    }
    form.classList.toggle("eval-case-closed", !open);
  }

  function prepare(form, words) {
    const heading = form.querySelector(":scope > h3");
    if (!heading || heading.querySelector(".eval-case-toggle")) return;
    const type = form.querySelector("select[name$='-case_type']");
    if (type && type.selectedIndex >= 0) {
      const chip = document.createElement("span");
      chip.className = "eval-case-type";
      const show = () => {
        chip.textContent = type.selectedIndex >= 0 ? type.options[type.selectedIndex].text : "";
      };
      show();
      type.addEventListener("change", show);
      heading.querySelector(".inline_label").after(chip);
    }
    const button = document.createElement("button");
    button.type = "button";
    button.className = "eval-case-toggle";
    button.addEventListener("click", () => setOpen(form, form.classList.contains("eval-case-closed"), words));
    heading.append(button);
    const hasError = form.querySelector(".errorlist") !== null;
    setOpen(form, hasError, words);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const group = document.getElementById("cases-group");
    if (!group) return;
    const words = labels();
    const saved = group.querySelectorAll(".inline-related.has_original:not(.empty-form)");
    saved.forEach((form) => prepare(form, words));
    if (saved.length < 2) return;
    const bar = document.createElement("p");
    bar.className = "eval-case-bar";
    [
      [words.openAll, true],
      [words.closeAll, false],
    ].forEach(([text, open]) => {
      const button = document.createElement("button");
      button.type = "button";
      button.className = open ? "eval-case-open-all" : "eval-case-close-all";
      button.textContent = text;
      button.addEventListener("click", () => saved.forEach((form) => setOpen(form, open, words)));
      bar.append(button);
    });
    group.querySelector("h2").after(bar);
  });
})();
