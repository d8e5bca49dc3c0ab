// tapekit Studio: progressive enhancement only. Every link works without this file.
(function () {
  "use strict";
  var STEP_URL = /^\/tapes\/[^/]+\/steps\/\d+$/;

  function loadPanel(href, push) {
    var panel = document.getElementById("panel");
    if (!panel) { window.location.href = href; return; }
    var url = href + (href.indexOf("?") < 0 ? "?" : "&") + "fragment=1";
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (!r.ok) { throw new Error(String(r.status)); }
        return r.text();
      })
      .then(function (html) {
        panel.innerHTML = html;  // server-rendered and escaped like every page
        panel.scrollTop = 0;
        var index = href.split("/").pop();
        document.querySelectorAll(".step-row.selected").forEach(function (el) { el.classList.remove("selected"); });
        var row = document.getElementById("step-" + index);
        if (row) { row.classList.add("selected"); }
        if (push) { history.pushState({ step: href }, "", href); }
      })
      .catch(function () { window.location.href = href; });
  }

  document.addEventListener("click", function (event) {
    if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) { return; }
    var link = event.target.closest("a.step-row, a.step-link");
    if (!link || !document.getElementById("panel")) { return; }
    var url = new URL(link.href, window.location.href);
    if (url.origin !== window.location.origin || !STEP_URL.test(url.pathname)) { return; }
    var tape = url.pathname.split("/steps/")[0];
    if (window.location.pathname.indexOf(tape) !== 0) { return; }  // another tape: a normal visit
    if (!document.getElementById("step-" + url.pathname.split("/").pop())) { return; }  // another page
    event.preventDefault();
    loadPanel(url.pathname, true);
  });

  window.addEventListener("popstate", function () {
    if (STEP_URL.test(window.location.pathname)) { loadPanel(window.location.pathname, false); }
    else { window.location.reload(); }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var target = document.getElementById("first-divergence");
    if (target && !window.location.hash) { target.scrollIntoView({ block: "center" }); }
    var selected = document.querySelector(".step-row.selected");
    if (selected && !window.location.hash) { selected.scrollIntoView({ block: "nearest" }); }
  });
})();
