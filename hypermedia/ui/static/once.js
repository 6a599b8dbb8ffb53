// Forms that act (upload, cancel, retry) submit once: a second click while the
// first request is on its way made a second upload and job, or answered a
// retry that worked with "Conflict".
(function () {
  "use strict";
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.method.toLowerCase() !== "post") return;
    if (form.dataset.sent === "1") { e.preventDefault(); return; }
    form.dataset.sent = "1";
    // Disabled after this event: a disabled button would not submit at all.
    window.setTimeout(function () {
      Array.prototype.forEach.call(form.querySelectorAll("button"), function (b) {
        b.disabled = true;
      });
    }, 0);
  });
  // Back to a page from the cache: its forms may be sent again.
  window.addEventListener("pageshow", function () {
    Array.prototype.forEach.call(document.querySelectorAll("form"), function (f) {
      f.dataset.sent = "";
      Array.prototype.forEach.call(f.querySelectorAll("button"), function (b) {
        b.disabled = false;
      });
    });
  });
})();
