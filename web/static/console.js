// txbroker console: progressive enhancement only. Every page is complete without this script; with
// it, times show in local time with their age, age bars move, the page's live region refreshes
// itself, and the abort confirmation opens as a dialog. Server HTML is inserted as is (the server
// escapes everything); text built here goes through textContent.
(() => {
  "use strict";

  const FRAGMENT_HEADER = "X-Console-Fragment";
  let clockSkew = Number(document.body.dataset.serverNow || Date.now()) - Date.now();
  const serverNow = () => Date.now() + clockSkew;

  // ---- times and durations

  const sameDay = (a, b) => a.toDateString() === b.toDateString();

  function localTime(ms) {
    const date = new Date(ms);
    const time = date.toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
    if (sameDay(date, new Date())) return time;
    const day = date.toLocaleDateString(undefined, { year: "numeric", month: "short", day: "numeric" });
    return `${day} ${time}`;
  }

  function duration(ms) {
    if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
    const s = ms / 1000;
    if (s < 10) return `${s.toFixed(1)} s`;
    if (s < 60) return `${Math.floor(s)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return s % 60 >= 1 ? `${m} min ${Math.floor(s % 60)} s` : `${m} min`;
    const h = Math.floor(m / 60);
    if (h < 48) return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
    return `${Math.floor(h / 24)} d ${h % 24} h`;
  }

  function ago(ms) {
    const age = serverNow() - ms;
    if (age < -1000) return `in ${duration(-age)}`;
    if (age < 1500) return "just now";
    return `${duration(age)} ago`;
  }

  function refreshTimes(root) {
    for (const el of root.querySelectorAll("time[data-ms]")) {
      const ms = Number(el.dataset.ms);
      const utc = el.dataset.utc || el.getAttribute("title") || "";
      el.dataset.utc = utc;
      if (el.dataset.format === "absolute") {
        el.textContent = `${localTime(ms)} (${ago(ms)})`;
      } else {
        el.textContent = ago(ms);
      }
      el.title = `${new Date(ms).toLocaleString()} · ${utc}`;
    }
    for (const meter of root.querySelectorAll("meter[data-start-ms]")) {
      const timeout = Number(meter.dataset.timeoutMs);
      const age = Math.max(0, serverNow() - Number(meter.dataset.startMs));
      meter.value = Math.min(age, timeout);
      const text = meter.parentElement.querySelector(".age-text");
      if (text) text.textContent = duration(age);
    }
  }

  // ---- the live region

  const live = document.getElementById("live");
  const status = document.getElementById("live-status");
  const statusText = status && status.querySelector(".live-text");
  const toggle = document.getElementById("live-toggle");
  const dialog = document.getElementById("console-dialog");
  let paused = false;
  let timer = null;

  function setStatus(kind, text) {
    if (!status) return;
    status.hidden = false;
    status.classList.toggle("paused", kind === "paused");
    status.classList.toggle("offline", kind === "offline");
    statusText.textContent = text;
  }

  function selectionInside(element) {
    const selection = window.getSelection();
    return selection && !selection.isCollapsed && element.contains(selection.anchorNode);
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refreshLive, Number(live.dataset.live) || 3000);
  }

  async function refreshLive() {
    if (paused || document.hidden || (dialog && dialog.open) || selectionInside(live)) return schedule();
    try {
      const response = await fetch(window.location.href, {
        headers: { [FRAGMENT_HEADER]: "live" }, cache: "no-store", credentials: "same-origin",
      });
      if (response.status >= 400 && response.status < 500) {
        // What the page shows is gone (a deleted topic, group or transactional id), no longer the
        // reader's to see, or the sign-in has lapsed (a revoked key): the page itself says which
        // (or asks to sign in again), instead of stale figures under "Offline · retrying".
        window.location.reload();
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const html = await response.text();
      const serverTime = Number(response.headers.get("X-Server-Time-Ms"));
      if (serverTime) clockSkew = serverTime - Date.now();
      const open = [...live.querySelectorAll("details[open][id]")].map((d) => d.id);
      live.innerHTML = html;
      for (const id of open) {
        const details = document.getElementById(id);
        if (details) details.open = true;
      }
      refreshTimes(live);
      setStatus("live", `Live · ${localTime(serverNow())}`);
      live.dispatchEvent(new CustomEvent("console:refreshed", { bubbles: true }));
    } catch (error) {
      setStatus("offline", "Offline · retrying");
    }
    schedule();
  }

  if (live && status) {
    setStatus("live", "Live");
    toggle.addEventListener("click", () => {
      paused = !paused;
      toggle.textContent = paused ? "Resume" : "Pause";
      setStatus(paused ? "paused" : "live", paused ? "Paused" : "Live");
      if (!paused) refreshLive();
    });
    document.addEventListener("visibilitychange", () => { if (!document.hidden && !paused) refreshLive(); });
    schedule();
  }

  // ---- dialogs: a link marked data-dialog opens its page's "dialog" fragment in a modal

  async function openDialog(link) {
    const body = dialog.querySelector(".dialog-body");
    try {
      const response = await fetch(link.href, { headers: { [FRAGMENT_HEADER]: "dialog" }, credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      body.innerHTML = await response.text();
    } catch (error) {
      window.location.href = link.href;  // the page itself asks for confirmation without the script
      return;
    }
    dialog.showModal();
    const cancel = body.querySelector("[data-close-dialog]");
    if (cancel) cancel.focus();
  }

  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target : null;
    if (!target) return;
    const opener = target.closest("a[data-dialog]");
    if (opener && dialog && typeof dialog.showModal === "function") {
      event.preventDefault();
      openDialog(opener);
      return;
    }
    const closer = target.closest("[data-close-dialog]");
    if (closer && dialog && dialog.open) {
      event.preventDefault();
      dialog.close();
      return;
    }
    const back = target.closest("a[data-back]");
    if (back && window.history.length > 1) {
      event.preventDefault();
      window.history.back();
    }
  });

  if (dialog) {
    dialog.addEventListener("click", (event) => { if (event.target === dialog) dialog.close(); });
    dialog.addEventListener("submit", () => {
      const button = dialog.querySelector("button[type=submit]");
      if (button) { button.disabled = true; button.textContent = "Aborting…"; }
    });
  }

  // ---- filters apply as soon as a choice changes

  for (const select of document.querySelectorAll("form[data-autosubmit] select")) {
    select.addEventListener("change", () => select.form.requestSubmit());
  }

  refreshTimes(document);
  setInterval(() => refreshTimes(document), 1000);
})();
