// The link page: the same file is served at /a/, /c/, /g/, /r/, /i/, /contact/
// and /invitation/. The link's keys are in the URL's "#" fragment, which the
// browser never sends to the server, so everything is worked out here.
"use strict";

(function () {
  var KINDS = {
    a: "SimpleX contact address",
    contact: "SimpleX contact address",
    i: "SimpleX one-time invitation",
    invitation: "SimpleX one-time invitation",
    g: "SimpleX group link",
    c: "SimpleX channel link",
    r: "SimpleX relay link"
  };

  function byId(id) {
    return document.getElementById(id);
  }

  // "a" for "/a/" and "/a".
  function actionOf(pathname) {
    var parts = pathname.split("/").filter(function (p) { return p !== ""; });
    return parts.length ? parts[parts.length - 1] : "";
  }

  // The link the SimpleX apps open. Short links (one-letter actions) name the
  // servers in the "h" parameter of the fragment: this host goes first.
  function appLink(action, hash, hostname) {
    var x = hash;
    if (action.length <= 1) {
      if (hash.indexOf("?") < 0) {
        x = hash + "?h=" + hostname;
      } else if (hash.indexOf("?h=") < 0 && hash.indexOf("&h=") < 0) {
        x = hash + "&h=" + hostname;
      } else {
        x = hash.replace(/([?&])h=([^&]+)/, function (_, sep, hosts) {
          return sep + "h=" + hostname + "," + hosts;
        });
      }
    }
    return "simplex:/" + action + x;
  }

  function drawQr(text) {
    var canvas = byId("link-qr");
    var ok = false;
    try {
      if (window.SmpQr && typeof window.SmpQr.draw === "function") {
        window.SmpQr.draw(canvas, text, { scale: 6, margin: 4 });
        ok = true;
      }
    } catch (e) {
      ok = false;
    }
    byId("link-qr-box").hidden = !ok;
    byId("link-qr-error").hidden = ok;
  }

  function render() {
    var action = actionOf(location.pathname);
    var kind = KINDS[action] || "SimpleX link";
    byId("link-kind").textContent = kind;
    document.title = kind;

    var url = new URL(location.href);
    url.protocol = "https:";
    url.pathname = "/" + action;
    var httpsLink = url.toString();
    byId("link-text").textContent = httpsLink;
    byId("link-text-row").hidden = false;

    var hash = url.hash; // "" when there is no fragment (or only "#")
    var complete = hash !== "";
    byId("link-incomplete").hidden = complete;
    byId("link-connect").hidden = !complete;
    if (!complete) return;

    byId("open-in-app").href = appLink(action, hash, location.hostname);
    drawQr(httpsLink);
    copyButton(httpsLink);
  }

  // The clipboard API exists only in secure contexts (https, localhost):
  // elsewhere the button stays hidden and the link can be selected by hand.
  function copyButton(text) {
    var button = byId("copy-link");
    if (!navigator.clipboard || !navigator.clipboard.writeText) return;
    button.hidden = false;
    button.onclick = function () {
      navigator.clipboard.writeText(text).then(
        function () { flash(button, "Copied"); },
        function () { flash(button, "Could not copy"); }
      );
    };
  }

  function flash(button, label) {
    button.textContent = label;
    clearTimeout(button.resetTimer);
    button.resetTimer = setTimeout(function () { button.textContent = "Copy link"; }, 2000);
  }

  function start() {
    render();
    // Pasting another fragment into the address bar does not reload the page.
    window.addEventListener("hashchange", render);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
