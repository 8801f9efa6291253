// The newest line is at the bottom, and almost always the one worth reading: start there.
(function () {
  var log = document.getElementById("log");
  if (log) { log.scrollIntoView({ block: "end" }); window.scrollTo(0, document.body.scrollHeight); }
})();
