// metal-ipam browser view: hash routing, bearer token from sessionStorage,
// every piece of data inserted as text (textContent / text nodes only).
"use strict";

(function () {
  const KEY = "metal-ipam-token";
  const $ = (id) => document.getElementById(id);
  const views = ["login-view", "pools-view", "pool-view", "machines-view", "search-view"];

  // el("td", {class: "num"}, "text", child, …): attributes by setAttribute,
  // children as text nodes or elements; never HTML.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const dash = (v) => (v === null || v === undefined || v === "" ? "—" : v);
  const fmt = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : dash(n));
  function when(secs) {
    if (secs === null || secs === undefined) return "—";
    return new Date(secs * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }
  function ago(secs, now) {
    if (secs === null || secs === undefined) return "";
    const d = Math.max(0, (now || Date.now() / 1000) - secs);
    if (d < 90) return Math.round(d) + " s ago";
    if (d < 5400) return Math.round(d / 60) + " min ago";
    if (d < 172800) return Math.round(d / 3600) + " h ago";
    return Math.round(d / 86400) + " days ago";
  }
  function status(text, isError) {
    const s = $("status");
    s.textContent = text || "";
    s.classList.toggle("error", !!isError);
  }
  function show(id) {
    for (const v of views) $(v).hidden = v !== id;
    const signedIn = id !== "login-view";
    $("nav").hidden = !signedIn;
    $("signout").hidden = !signedIn;
  }
  function markNav(view) {
    for (const a of $("nav").querySelectorAll("a")) {
      if (a.dataset.view === view) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
  }
  function replaceRows(table, rows) {
    const body = table.tBodies[0];
    body.replaceChildren(...rows);
  }
  function emptyRow(cols, text) {
    return el("tr", {}, el("td", { colspan: cols, class: "empty" }, text));
  }
  function poolHref(id) {
    return "#/pools/" + id.split("/").map(encodeURIComponent).join("/");
  }
  function stateBadge(s) {
    return el("span", { class: "state " + String(s).replace(/[^a-z-]/g, "") }, s);
  }

  // --- token and fetch --------------------------------------------------
  const token = () => sessionStorage.getItem(KEY);

  class Unauthorized extends Error {}

  async function api(path) {
    const t = token();
    if (!t) throw new Unauthorized("no token");
    const r = await fetch(path, {
      headers: { Authorization: "Bearer " + t, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    if (r.status === 401) {
      sessionStorage.removeItem(KEY);
      throw new Unauthorized("The token was not accepted: sign in again.");
    }
    let body = null;
    try { body = await r.json(); } catch (_) { body = null; }
    if (!r.ok) {
      const msg = body && body.message ? body.message : "HTTP " + r.status;
      throw new Error(msg);
    }
    return body;
  }

  function login(message, isError) {
    show("login-view");
    markNav(null);
    status(message || "Sign in with the API token or a read token.", isError !== false && !!message);
    $("token").value = "";
    $("token").focus();
  }

  // --- views ------------------------------------------------------------
  async function pools() {
    show("pools-view");
    markNav("pools");
    status("Loading pools…");
    const o = await api("/ui/api/overview");
    const rows = o.pools.map((p) => {
      const pct = typeof p.utilisation === "number" ? p.utilisation : 0;
      return el("tr", { "data-pool": p.id },
        el("th", { scope: "row" }, el("a", { href: poolHref(p.id) }, p.id)),
        el("td", {}, p.kind),
        el("td", {}, dash(p.family)),
        el("td", {}, p.vrfBacked ? "yes" : "no"),
        el("td", { class: "util" },
          el("meter", { min: 0, max: 100, low: 70, high: 90, optimum: 0, value: pct, "aria-hidden": "true" }),
          el("span", {}, fmt(p.used) + "/" + fmt(p.total) + " (" + pct + "%)")),
        el("td", { class: "num used" }, p.used),
        el("td", { class: "num" }, fmt(p.free)),
        el("td", { class: "num" }, fmt(p.cooling)),
        el("td", { class: "num" }, fmt(p.outOfRange)));
    });
    replaceRows($("pools"), rows.length ? rows : [emptyRow(9, "No pools in the store yet.")]);
    const meta = [];
    meta.push(o.pools.length + (o.pools.length === 1 ? " pool" : " pools"));
    if (o.reconcile) {
      meta.push("last reconcile " + when(o.reconcile.at) + " (" + ago(o.reconcile.at, o.now) + "), " +
        o.reconcile.errors + " errors");
    } else {
      meta.push("no reconcile run yet");
    }
    if (o.poll) meta.push("Metal poll: last event " + dash(o.poll.last) + ", " + o.poll.pending + " devices pending");
    $("overview-meta").textContent = meta.join(" · ");
    status("");
  }

  function table(id, caption, heads, rows, cols) {
    return el("div", { class: "scroll", tabindex: 0, role: "region", "aria-label": caption },
      el("table", id ? { id } : {},
        el("caption", { class: "sr-only" }, caption),
        el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, ...(rows.length ? rows : [emptyRow(cols || heads.length, "None.")]))));
  }

  async function poolDetail(parts) {
    show("pool-view");
    markNav("pools");
    const id = parts.join("/");
    status("Loading pool " + id + "…");
    // A prefix pool's id starts with "+" (see view.rs, pool_ref).
    const prefix = parts[0].startsWith("+");
    const names = [parts[0].replace(/^\+/, "")].concat(parts.slice(1));
    const path = "/ui/api/" + (names.length === 2 ? "" : "global-") +
      (prefix ? "prefix-pools/" : "pools/") + names.map(encodeURIComponent).join("/");
    const d = await api(path);
    const p = d.pool;
    const box = $("pool-detail");
    const facts = el("dl", { class: "facts" });
    const fact = (k, v) => facts.append(el("dt", {}, k), el("dd", {}, v));
    fact("Kind", p.kind);
    fact("Family", dash(p.family));
    fact("Utilisation", fmt(p.used) + "/" + fmt(p.total) + " (" + p.utilisation + "%)");
    fact("Free", fmt(p.free));
    fact("Cooling", fmt(p.cooling));
    fact("Out of range", fmt(p.outOfRange));
    fact("Addresses (spec)", d.spec.addresses.length ? d.spec.addresses.join(", ") : "— (from the Metal block)");
    if (d.spec.excludedAddresses.length) fact("Excluded", d.spec.excludedAddresses.join(", "));
    fact("Prefix", "/" + d.spec.prefix);
    fact("Gateway", dash(d.spec.gateway));
    fact("Reuse grace period", d.spec.graceSeconds + " s");

    const parts2 = [el("h2", { id: "pool-title" }, "Pool " + p.id), facts];
    if (d.metal) {
      const m = d.metal;
      const res = (name, h, state) => el("tr", {},
        el("th", { scope: "row" }, name),
        el("td", { class: "mono" }, h ? h.id : "—"),
        el("td", {}, h ? (h.created ? "created" : "adopted") : "not yet"),
        el("td", {}, state ? stateBadge(state) : "—"));
      parts2.push(el("h3", {}, "Metal resources"),
        el("p", { class: "meta" }, "Phase: ", stateBadge(m.phase)),
        table("metal", "Metal resources", ["Resource", "Id", "Origin", "State"], [
          res("VRF", m.vrf), res("IP reservation", m.reservation), res("VLAN", m.vlan),
          res("Gateway", m.gateway, m.gatewayState)]));
    }
    const addrRows = d.addresses.map((a) => el("tr", { "data-address": a.address },
      el("th", { scope: "row", class: "mono" }, a.address),
      el("td", {}, stateBadge(a.inRange ? a.state : "out-of-range")),
      el("td", {}, a.claim ? el("a", { href: "#/search?q=" + encodeURIComponent(a.claim) }, a.claim) : "—"),
      el("td", {}, dash(a.cluster)),
      el("td", {}, dash(a.ipAddress)),
      el("td", {}, a.machine ? el("a", { href: "#/search?q=" + encodeURIComponent(a.machine) }, a.machine) : "—"),
      el("td", {}, a.until ? when(a.until) : "—")));
    parts2.push(el("h3", {}, "Addresses and holders"),
      el("p", { class: "meta" }, "The machine is known for machine-network addresses only (from the last reconcile); " +
        "the owner of a plain Cluster API claim is not stored and is shown as —." +
        (d.addressesOmitted ? " " + fmt(d.addressesOmitted) + " more addresses not listed." : "")),
      table("addresses", "Addresses and holders",
        ["Address", "State", "Claim", "Cluster", "IPAddress", "Machine", "Cooling until"], addrRows));
    parts2.push(el("h3", {}, "Free ranges"),
      d.free.length
        ? el("ul", { class: "ranges", id: "free" }, ...d.free.map((r) => el("li", { class: "mono" }, r)))
        : el("p", { class: "meta", id: "free" }, "No free address."));
    if (d.freeRangesOmitted) parts2.push(el("p", { class: "meta" }, fmt(d.freeRangesOmitted) + " more ranges not listed."));
    parts2.push(el("h3", {}, "Cooling down"),
      table("cooling", "Cooling addresses", ["Address", "Reusable from"],
        d.cooling.map((c) => el("tr", { "data-address": c.address },
          el("th", { scope: "row", class: "mono" }, c.address), el("td", {}, when(c.until))))));
    box.replaceChildren(...parts2);
    status("");
  }

  async function machines() {
    show("machines-view");
    markNav("machines");
    status("Loading machines…");
    const d = await api("/ui/api/machines");
    const rows = d.machines.map((m) => {
      const id = m.namespace + "/" + m.name;
      const ports = el("td", { class: "wrap" });
      (m.ports || []).forEach((p, i) => {
        if (i) ports.append(el("br"));
        ports.append(p.port + " " + p.mode + (p.vlans && p.vlans.length ? ": " + p.vlans.join(", ") : ""));
      });
      const addrs = el("td", { class: "mono" });
      Object.entries(m.addresses || {}).forEach(([vlan, a], i) => {
        if (i) addrs.append(el("br"));
        addrs.append("VLAN " + vlan + ": " + a);
      });
      if (!addrs.childNodes.length) addrs.textContent = "—";
      if (!ports.childNodes.length) ports.textContent = "—";
      const phase = el("td", {}, stateBadge(m.phase));
      if (m.error) phase.append(el("br"), el("span", { class: "meta" }, m.error));
      return el("tr", { "data-machine": id },
        el("th", { scope: "row" }, id), el("td", {}, dash(m.cluster)), el("td", {}, dash(m.profile)),
        el("td", { class: "mono" }, dash(m.device)), ports, addrs, phase);
    });
    const empty = d.asOf === null
      ? "No reconcile run yet: machines appear after the first full reconcile."
      : "No machine has opted into a network profile.";
    replaceRows($("machines"), rows.length ? rows : [emptyRow(7, empty)]);
    $("machines-meta").textContent = d.asOf === null
      ? "No reconcile run yet."
      : "As of " + when(d.asOf) + " (" + ago(d.asOf) + ")" + (d.omitted ? "; " + d.omitted + " more not listed" : "") + ".";
    status("");
  }

  async function search(q) {
    show("search-view");
    markNav("search");
    $("search").value = q;
    if (!q) {
      replaceRows($("results"), [emptyRow(6, "Type an address, a claim or a machine name.")]);
      $("search-meta").textContent = "";
      status("");
      return;
    }
    status("Searching…");
    const d = await api("/ui/api/search?q=" + encodeURIComponent(q));
    const rows = d.results.map((r) => {
      const attrs = {};
      if (r.claim) attrs["data-claim"] = r.claim;
      if (r.machine) attrs["data-machine"] = r.machine;
      let found;
      if (r.type === "machine") found = el("a", { href: "#/machines" }, "machine " + r.machine);
      else if (r.type === "claim") found = "claim " + r.claim;
      else found = r.claim ? "address, claim " + r.claim : "address";
      const addr = r.type === "machine" ? Object.values(r.addresses || {}).join(", ") : r.address;
      return el("tr", attrs,
        el("th", { scope: "row" }, found),
        el("td", { class: "mono" }, dash(addr)),
        el("td", {}, r.pool ? el("a", { href: poolHref(r.pool) }, r.pool) : "—"),
        el("td", {}, r.state ? stateBadge(r.state) : (r.phase ? stateBadge(r.phase) : "—")),
        el("td", {}, dash(r.cluster)),
        el("td", {}, r.machine ? el("a", { href: "#/machines" }, r.machine) : "—"));
    });
    replaceRows($("results"), rows.length ? rows : [emptyRow(6, "Nothing found.")]);
    $("search-meta").textContent = d.results.length + " results" + (d.truncated ? " (first " + d.results.length + " shown)" : "");
    status(d.results.length + " results for “" + d.query + "”.");
  }

  // --- routing ------------------------------------------------------------
  async function route() {
    if (!token()) return login();
    const h = location.hash.replace(/^#\/?/, "");
    const [path, query] = h.split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    try {
      if (parts[0] === "pools" && parts.length >= 2) await poolDetail(parts.slice(1, 3));
      else if (parts[0] === "machines") await machines();
      else if (parts[0] === "search") await search(new URLSearchParams(query || "").get("q") || "");
      else await pools();
    } catch (e) {
      if (e instanceof Unauthorized) login(e.message);
      else status("Could not load: " + e.message, true);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = $("token").value.trim();
      $("token").value = "";
      if (!t) return;
      sessionStorage.setItem(KEY, t);
      status("");
      route();
      $("main").focus();
    });
    $("signout").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      for (const id of ["pools", "machines", "results"]) replaceRows($(id), []);
      $("pool-detail").replaceChildren();
      login("Signed out.", false);
    });
    $("search-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = $("search").value.trim();
      const target = "#/search?q=" + encodeURIComponent(q);
      if (location.hash === target) route(); else location.hash = target;
    });
    window.addEventListener("hashchange", route);
    route();
  });
})();
