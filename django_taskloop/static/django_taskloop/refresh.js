/* django-taskloop admin: live refresh without reloading the page (no CDN, no build step).
   Every few seconds the page is fetched again and its live parts ([data-tl-live], a change
   list's rows and count) are swapped in. It waits while the operator is busy: rows selected,
   a field focused, or the tab hidden. */
(function () {
  "use strict";
  var EVERY = 5000;
  function busy() {
    if (document.hidden) return true;
    if (document.querySelector("input.action-select:checked, #action-toggle:checked")) return true;
    var active = document.activeElement;
    return !!(active && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(active.tagName) && active.type !== "checkbox");
  }
  function live(doc) {
    var parts = Array.prototype.slice.call(doc.querySelectorAll("[data-tl-live]"));
    ["#result_list tbody", "p.paginator"].forEach(function (selector) {
      var node = doc.querySelector(selector);
      if (node) parts.push(node);
    });
    return parts;
  }
  function swap() {
    if (busy()) return;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Taskloop-Refresh": "1" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null || busy()) return;
        var fresh = live(new DOMParser().parseFromString(html, "text/html"));
        var current = live(document);
        if (fresh.length !== current.length) return;
        current.forEach(function (node, i) { node.innerHTML = fresh[i].innerHTML; });
        var stamp = document.querySelector(".tl-refresh");
        if (stamp) stamp.textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function () { /* the next round tries again */ });
  }
  window.setInterval(swap, EVERY);
})();
