// pgqueue.web: redraw the queues page's live part every few seconds.
// No framework, no network access beyond this dashboard: the server renders
// (and escapes) the fragment; this script only swaps it in. Without
// JavaScript the page still works: reload it to refresh.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  if (!live || !window.fetch) {
    return;
  }
  var source = live.getAttribute("data-src");
  var every = Math.max(100, 1000 * parseFloat(live.getAttribute("data-interval") || "2"));
  var timer = null;

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, every);
  }

  function refresh() {
    if (document.hidden) {
      return; // resumed by visibilitychange
    }
    fetch(source, { headers: { Accept: "text/html" }, cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        live.setAttribute("data-updated", String(Date.now()));
        say("Updated " + new Date().toLocaleTimeString() + "; every " + every / 1000 + " s.");
      })
      .catch(function (error) {
        say("Not updated (" + error.message + "); trying again.");
      })
      .then(schedule);
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      refresh();
    }
  });
  schedule();
})();

// The job listing: a box that selects (or clears) every row of the page.
// Without JavaScript each row's box still works, and so does "All N matching".
(function () {
  "use strict";
  var page = document.getElementById("bulk-page");
  if (!page) {
    return;
  }
  var rows = document.querySelectorAll('input[name="id"][form="bulk"]');
  page.hidden = false;
  page.addEventListener("change", function () {
    for (var i = 0; i < rows.length; i++) {
      rows[i].checked = page.checked;
    }
  });
})();

// The listing's "All matching" box: once checked, it says how many match
// (asked of /api/count then, not with every page: a count may scan).
(function () {
  "use strict";
  var box = document.getElementById("bulk-all");
  var count = document.getElementById("bulk-count");
  if (!box || !count || !count.getAttribute("data-src") || !window.fetch) {
    return;
  }
  var asked = false;
  box.addEventListener("change", function () {
    if (!box.checked || asked) {
      return;
    }
    asked = true;
    fetch(count.getAttribute("data-src"), { cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (found) {
        count.textContent = found.text;
      })
      .catch(function () {
        asked = false; // the confirmation page states the count anyway
      });
  });
})();
