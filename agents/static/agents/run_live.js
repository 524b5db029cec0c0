// A run's page follows the run while it has not finished: the run's event stream (session-authorised, served by
// the admin) says something happened, and the page fetches the timeline again. Also: confirmations for forms
// marked data-confirm (Cancel run).
(function () {
  "use strict";

  function confirmForms(root) {
    root.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.confirm(form.dataset.confirm)) {
          event.preventDefault();
        }
      });
    });
  }

  function follow(container) {
    var timelineUrl = container.dataset.timelineUrl;
    var eventsUrl = container.dataset.eventsUrl;
    var source = null;
    var refreshing = false;
    var again = false;

    function finished() {
      var live = container.querySelector("#run-live");
      return live && live.dataset.finished === "true";
    }

    function refresh() {
      if (refreshing) {
        again = true;
        return;
      }
      refreshing = true;
      fetch(timelineUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (response) {
          return response.ok ? response.text() : null;
        })
        .then(function (html) {
          if (html !== null) {
            container.innerHTML = html;
            confirmForms(container);
          }
        })
        .finally(function () {
          refreshing = false;
          if (again) {
            again = false;
            refresh();
          } else if (finished() && source) {
            source.close();
            source = null;
          }
        });
    }

    if (finished() || !window.EventSource) {
      return;
    }
    source = new EventSource(eventsUrl);
    // Every kind of event the timeline draws a step from (agents.admin_runs._entries_from_events): one left out
    // here shows only once another kind comes (a flow's node without a call, never).
    [
      "status",
      "rule",
      "deterministic_result",
      "model_turn",
      "tool_call",
      "approval",
      "message",
      "flow_node",
      "tool_selection",
      "parallel_calls",
    ].forEach(function (kind) {
      source.addEventListener(kind, refresh);
    });
    source.addEventListener("end", function () {
      source.close();
      source = null;
      refresh();
    });
    source.addEventListener("error", function () {
      // The browser reconnects by itself (with Last-Event-ID); a finished run needs no stream.
      if (finished() && source) {
        source.close();
        source = null;
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmForms(document);
    var container = document.getElementById("run-live-container");
    if (container) {
      follow(container);
    }
  });
})();
