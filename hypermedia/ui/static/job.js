// Live job page: follow /ui/jobs/{id}/stream (Server-Sent Events), update the
// status and progress, append events, and reload once the job has ended.
(function () {
  "use strict";
  var root = document.getElementById("job");
  if (!root || root.dataset.terminal === "1" || !window.EventSource) return;
  var statusEl = document.getElementById("status");
  var bar = document.getElementById("progress");
  var barText = document.getElementById("progress-text");
  var body = document.getElementById("events-body");
  // Statuses from the server (queue/states.py): a job's end, and the waits
  // between attempts, where the last attempt's progress no longer holds.
  var FINAL = (root.dataset.final || "").split(" ");
  var WAITING = (root.dataset.waiting || "").split(" ");
  var source = new EventSource(root.dataset.stream);

  function cell(tr, text) {
    var td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    tr.appendChild(td);
  }

  function setStatus(status) {
    statusEl.textContent = status;
    statusEl.className = "status s-" + status.replace(/[^a-z_]/g, "");
    root.dataset.status = status;
    if (WAITING.indexOf(status) >= 0 && bar && barText) {  // as the server renders it
      bar.value = 0;  // empty: with no value it is a moving "busy" bar
      barText.textContent = "";
    }
  }

  // The browser fires a plain "error" (no data) when the connection drops;
  // it reconnects by itself unless the server refused (401, 404): then say so.
  function dropped() {
    if (source.readyState !== EventSource.CLOSED || root.dataset.ended === "1") return;
    if (document.getElementById("live-stopped")) return;
    var note = document.createElement("p");
    note.id = "live-stopped";
    note.className = "muted";
    note.textContent = "Live updates stopped: reload the page.";
    root.insertBefore(note, root.firstChild);
  }

  function onEvent(e) {
    if (!e.data) return dropped();
    var row = JSON.parse(e.data);
    var tr = document.createElement("tr");
    tr.className = "live";
    // UTC, as the server writes every time ("2024-05-01 12:00:00 UTC").
    var when = String(row.created_at || "").replace("T", " ").slice(0, 19);
    cell(tr, when ? when + " UTC" : "");
    cell(tr, row.kind);
    cell(tr, row.to_status ? (row.from_status || "∅") + " → " + row.to_status : "");
    cell(tr, row.attempt_number);
    var message = row.message || "";
    // The engine's messages begin "CODE: ..." already: the code once.
    var coded = row.code && message.indexOf(row.code + ":") !== 0;
    cell(tr, (coded ? row.code + " " : "") + message);
    cell(tr, row.actor);
    body.appendChild(tr);
    if (row.to_status) setStatus(row.to_status);
    if (row.kind === "progress" && bar && barText) {
      barText.textContent = row.message || "";
      var m = /(\d+(?:\.\d+)?)%/.exec(row.message || "");
      if (m) bar.value = parseFloat(m[1]);
    }
  }

  ["event", "progress", "log", "warning", "error"].forEach(function (kind) {
    source.addEventListener(kind, onEvent);
  });
  source.addEventListener("end", function (e) {
    source.close();
    root.dataset.ended = "1";
    var status = JSON.parse(e.data).status;
    // Not the job's end but the stream's ("unauthorized": the session or its
    // token ended): no badge for it; the reload leads to the login form.
    if (FINAL.indexOf(status) < 0) return window.location.reload();
    setStatus(status);
    window.setTimeout(function () { window.location.reload(); }, 400);
  });
})();
