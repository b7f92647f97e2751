/* Cairn dashboard: live last-known values over WAMP (autobahn-js, JSON over WebSocket), a
 * history chart paged with wamp.subscription.get_events, and the router's status.
 *
 * Everything comes from the router that served this page: no other host is ever contacted.
 * Ages of readings are measured on monotonic clocks, never on a wall clock: a live reading's
 * from its arrival (performance.now()), a retained one's from the router's CLOCK_BOOTTIME age
 * (cairn.retained.received), so neither a wrong or stepping gateway clock nor this screen's
 * clock changes them. Only a reading from an earlier boot of the gateway has just its wall
 * time, shown as such (with a note when the gateway clock is not synchronized). Times on the
 * page are the gateway's (its offset from this browser's clock comes from cairn.router.status).
 *
 * URL: ?realm=NAME (default realm1), #DEVICE opens that device's chart, ?history_page=N sets
 * the get_events page size (default 500; the tests use a small one to exercise paging).
 */
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const REALM = params.get("realm") || "realm1";
  const PAGE = intParam("history_page", 1, 1000, 500); // events per get_events call
  const MAX_POINTS = 10000;            // a chart reads at most this many readings
  const STATUS_EVERY_MS = 5000;
  const OLD_AFTER_MS = 5 * 60 * 1000;  // a reading older than this is shown in amber
  const SENSOR_PREFIX = "sensor.";
  const DEVICE_PREFIX = "gateway.device.";
  const HISTORY_RULE = ["sensor", { match: "prefix" }];
  const WS_URL = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
  const LOGIN_REASONS = new Set(["wamp.error.no_auth_method",
                                 "wamp.error.authentication_failed",
                                 "wamp.error.not_authorized"]);
  const SERIES = {
    temperature: { label: "Temperature", unit: "°C", digits: 1 },
    humidity: { label: "Humidity", unit: "% RH", digits: 0 },
  };

  const state = {
    connection: null,
    session: null,
    generation: 0,          // one per joined session: late answers of an old one are dropped
    credentials: loadCredentials(),
    devices: new Map(),     // device id -> {id, el, reading, receivedAt, receivedWall, status}
    historyLookup: null,    // promise of the id of the history subscription on "sensor"
    clockOffset: 0,         // gateway wall clock minus this browser's clock, ms
    clockSynced: null,
    statusTimer: null,
    reconnectDelay: 1000,
    reconnectTimer: null,
    selected: null,
    range: 3600000,
    chart: null,            // {device, range, points: [{t, temperature, humidity}], pages, truncated}
    chartToken: null,
    settings: null,         // the last cairn.admin.config.get answer (admins only)
  };

  const $ = (id) => document.getElementById(id);

  // -- connection ------------------------------------------------------------------------

  function connect() {
    clearTimeout(state.reconnectTimer);
    const options = {
      url: WS_URL,
      realm: REALM,
      serializers: [new autobahn.serializer.JSONSerializer()],
      max_retries: 0, // reconnects are ours: autobahn gives up after a GOODBYE
    };
    const credentials = state.credentials;
    if (credentials) {
      options.authmethods = ["ticket"];
      options.authid = credentials.authid;
      options.onchallenge = (session, method) => (method === "ticket" ? credentials.secret : "");
    }
    const connection = new autobahn.Connection(options);
    connection.onopen = (session, details) => guarded(onJoin)(connection, session, details);
    connection.onclose = (reason, details) => onClose(connection, reason, details);
    state.connection = connection;
    setConnection("connecting", "connecting");
    connection.open();
  }

  function onJoin(connection, session, details) {
    if (connection !== state.connection) return;
    const generation = ++state.generation;
    state.session = session;
    state.historyLookup = null;
    state.reconnectDelay = 1000;
    setConnection("live", "live");
    hideError();
    $("login").hidden = true;
    $("login-submit").disabled = false;
    $("signout").hidden = !state.credentials;
    $("realm").textContent = REALM + (state.credentials ? " · " + details.authid : "");
    const subscribed = [[SENSOR_PREFIX, onReading], [DEVICE_PREFIX, onDeviceStatus]].map(
      ([prefix, handler]) => session.subscribe(prefix, guarded(handler),
                                               { match: "prefix", get_retained: true })
        .then(null, (e) => showError(`Cannot subscribe to ${prefix}*: ${errorText(e)}`)));
    Promise.all(subscribed).then(() => setTimeout(() => {
      if (generation === state.generation && state.devices.size === 0) $("empty").hidden = false;
    }, 1000));
    refreshStatus();
    probeSettings(session, generation);
    clearInterval(state.statusTimer);
    state.statusTimer = setInterval(refreshStatus, STATUS_EVERY_MS);
    if (state.selected && state.devices.has(state.selected)) loadChart(); // reconnected
  }

  function onClose(connection, reason, details) {
    if (connection !== state.connection) return true; // replaced (login, sign out)
    state.session = null;
    state.generation++;
    clearInterval(state.statusTimer);
    const refusal = details && details.reason;
    if (LOGIN_REASONS.has(refusal)) {
      showLogin(refusal);
      setConnection("offline", "sign-in needed");
      return true;
    }
    if (refusal && refusal.startsWith("wamp.error.")) {
      showError("The router refused the session: " + refusal +
                (details.message ? " (" + details.message + ")" : ""));
    }
    setConnection("offline", reason === "lost" ? "connection lost" : "offline");
    state.reconnectTimer = setTimeout(connect, state.reconnectDelay);
    state.reconnectDelay = Math.min(state.reconnectDelay * 2, 15000);
    return true;
  }

  function reconnect() {
    const old = state.connection;
    state.connection = null;
    if (old) {
      try { old.close(); } catch (e) { /* already closed */ }
    }
    connect();
  }

  function setConnection(kind, text) {
    const el = $("conn");
    el.dataset.state = kind;
    el.textContent = text;
  }

  // -- login -----------------------------------------------------------------------------

  function showLogin(refusal) {
    const tried = Boolean(state.credentials);
    $("login-why").textContent = tried
      ? "Signing in as " + state.credentials.authid + " did not work."
      : "This gateway does not allow anonymous access: sign in with a user of the realm.";
    const error = $("login-error");
    error.hidden = !tried;
    error.textContent = refusal === "wamp.error.authentication_failed"
      ? "Wrong user or secret (after 5 failures, wait a minute)."
      : "The router refused that user (" + refusal + ").";
    $("login-submit").disabled = false;
    $("login").hidden = false;
    if (tried) $("login-authid").value = state.credentials.authid;
    (tried ? $("login-secret") : $("login-authid")).focus();
  }

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const authid = $("login-authid").value.trim();
    const secret = $("login-secret").value;
    if (!authid || !secret) return;
    state.credentials = { authid, secret };
    saveCredentials(state.credentials);
    $("login-submit").disabled = true;
    $("login-secret").value = "";
    reconnect();
  });

  $("signout").addEventListener("click", () => {
    state.credentials = null;
    saveCredentials(null);
    $("signout").hidden = true;
    reconnect();
  });

  function loadCredentials() {
    try {
      const saved = JSON.parse(sessionStorage.getItem("cairn.login") || "null");
      return saved && saved.authid && saved.secret ? saved : null;
    } catch (e) {
      return null;
    }
  }

  function saveCredentials(credentials) {
    try {
      if (credentials) sessionStorage.setItem("cairn.login", JSON.stringify(credentials));
      else sessionStorage.removeItem("cairn.login");
    } catch (e) { /* storage disabled: ask again after a reload */ }
  }

  // -- live values -----------------------------------------------------------------------

  function onReading(args, kwargs, event) {
    const topic = event.topic || "";
    if (!topic.startsWith(SENSOR_PREFIX) || topic.length === SENSOR_PREFIX.length) return;
    const device = deviceFor(topic.slice(SENSOR_PREFIX.length));
    device.reading = readingOf(args, kwargs);
    device.receivedWall = null;
    if (event.retained) {
      device.receivedAt = null;
      findReceiveTime(device, topic, event.publication);
    } else {
      device.receivedAt = performance.now();
      flash(device.el);
      if (state.chart && state.chart.device === device.id) {
        state.chart.points.push(pointOf(gatewayNow(), device.reading));
        drawCharts();
      }
    }
    renderTile(device);
  }

  function onDeviceStatus(args, kwargs, event) {
    const match = /^gateway\.device\.(.+)\.status$/.exec(event.topic || "");
    if (!match) return;
    const device = deviceFor(match[1]);
    const value = readingOf(args, kwargs);
    device.status = {
      status: typeof value.status === "string" ? value.status : "unknown",
      reason: value.reason == null ? "" : String(value.reason),
      since: typeof value.since === "number" ? value.since * 1000 : null,
    };
    renderTile(device);
  }

  /** A retained reading carries no time: the router tells its age (by CLOCK_BOOTTIME) or,
   * for a reading of an earlier boot, its wall time. */
  function findReceiveTime(device, topic, publication) {
    const generation = state.generation;
    state.session.call("cairn.retained.received", [topic]).then((received) => {
      if (!received || generation !== state.generation || device.receivedAt !== null
          || received.publication !== publication) return;
      if (typeof received.age_s === "number") {
        device.receivedAt = performance.now() - received.age_s * 1000;
      } else {
        device.receivedWall = { t: Date.parse(received.timestamp),
                                synced: received.synchronized === true };
      }
      renderTile(device);
    }).catch(() => { /* an older router: the age stays unknown */ });
  }

  function historySubscription() {
    if (!state.historyLookup) {
      state.historyLookup = state.session
        ? state.session.call("wamp.subscription.lookup", HISTORY_RULE).then((id) => id ?? null)
        : Promise.resolve(null);
    }
    return state.historyLookup;
  }

  function deviceFor(id) {
    let device = state.devices.get(id);
    if (device) return device;
    device = { id, el: createTile(id), reading: null, receivedAt: null, receivedWall: null,
               status: null };
    state.devices.set(id, device);
    const tiles = $("tiles");
    const after = [...tiles.children].find((el) => el.dataset.device > id);
    tiles.insertBefore(device.el, after || null);
    $("empty").hidden = true;
    if (id === state.selected) select(id, true);
    return device;
  }

  function createTile(id) {
    const el = h("button", { class: "tile", type: "button", "data-device": id,
                             "aria-pressed": "false" },
      h("div", { class: "tile-head" },
        h("span", { class: "tile-name", title: id }, id),
        h("span", { class: "badge" }, "no status")),
      h("div", { class: "readings" },
        h("span", { class: "reading reading-temperature" },
          h("span", { class: "value", "data-field": "temperature" }, "–"),
          h("span", { class: "unit" }, SERIES.temperature.unit)),
        h("span", { class: "reading reading-humidity" },
          h("span", { class: "value", "data-field": "humidity" }, "–"),
          h("span", { class: "unit" }, SERIES.humidity.unit))),
      h("div", { class: "extras" }),
      h("div", { class: "reason" }),
      h("div", { class: "tile-foot" }, h("span", { class: "age" }, "")));
    el.addEventListener("click", () => select(state.selected === id ? null : id));
    return el;
  }

  function renderTile(device) {
    const el = device.el;
    const reading = device.reading || {};
    for (const name of ["temperature", "humidity"]) {
      el.querySelector(`[data-field="${name}"]`).textContent =
        number(reading[name], SERIES[name].digits);
    }
    const extras = el.querySelector(".extras");
    extras.replaceChildren(...Object.entries(reading)
      .filter(([key, value]) => !(key in SERIES) && typeof value === "number")
      .slice(0, 4)
      .map(([key, value]) => h("span", {}, key + " ", h("b", {}, number(value, 2)))));
    const status = device.status;
    el.dataset.status = status ? status.status : "none";
    el.querySelector(".badge").textContent = status ? status.status : "no status";
    const reason = el.querySelector(".reason");
    reason.textContent = status && status.reason ? status.reason : "";
    reason.title = status && status.since
      ? status.status + " since " + new Date(status.since).toLocaleString() : "";
    renderAge(device);
  }

  function renderAge(device) {
    const age = device.el.querySelector(".age");
    const wall = device.receivedWall;
    const unsynced = " (gateway clock not synchronized)";
    age.title = "";
    age.classList.remove("unsynced");
    if (!device.reading) {
      age.textContent = "no reading yet";
    } else if (device.receivedAt !== null) { // by a monotonic clock: right whatever the time
      const ms = performance.now() - device.receivedAt;
      showAge(age, ms);
      age.title = "received " + formatDate(gatewayNow() - ms)
        + (state.clockSynced === false ? unsynced : "");
    } else if (wall && wall.synced && state.clockSynced === true) {
      showAge(age, gatewayNow() - wall.t);
      age.title = "received " + formatDate(wall.t);
    } else if (wall) { // an earlier boot's wall time, from a clock that was or is not set
      age.textContent = formatDate(wall.t) + ", clock not synchronized";
      age.classList.add("unsynced");
      age.title = "received before the gateway restarted, by its wall clock, which was not "
        + "synchronized then or now: the time may be wrong";
    } else {
      age.textContent = "received earlier";
    }
  }

  function showAge(age, ms) {
    age.textContent = ms < 5000 ? "just now" : formatDuration(ms / 1000) + " ago";
    age.classList.toggle("old", ms > OLD_AFTER_MS);
  }

  function flash(el) {
    el.classList.remove("flash");
    void el.offsetWidth; // restart the animation
    el.classList.add("flash");
  }

  function readingOf(args, kwargs) {
    if (kwargs && Object.keys(kwargs).length) return kwargs;
    if (args && args.length) {
      const first = args[0];
      if (first && typeof first === "object" && !Array.isArray(first)) return first;
      if (typeof first === "number") return { value: first };
    }
    return {};
  }

  // -- the status strip ------------------------------------------------------------------

  function refreshStatus() {
    const session = state.session;
    if (!session) return;
    const generation = state.generation;
    const sent = Date.now();
    session.call("cairn.router.status").then((result) => {
      if (generation !== state.generation) return;
      const received = Date.now();
      const status = result instanceof autobahn.Result ? result.args[0] || result.kwargs : result;
      renderStatus(status, (sent + received) / 2);
    }, (e) => {
      if (generation !== state.generation) return;
      setStat("st-uptime", "unavailable", errorText(e), "warn");
    });
  }

  function renderStatus(s, at) {
    const clock = s.clock || {};
    if (clock.now) state.clockOffset = Date.parse(clock.now) - at;
    state.clockSynced = clock.synchronized;
    setStat("st-uptime", formatDuration(s.uptime_s));
    setStat("st-sessions", String(s.sessions));
    const store = s.store || {};
    setStat("st-store", formatBytes(store.bytes), plural(store.events, "event"));
    if (store.oldest && store.newest) {
      const span = (Date.parse(store.newest) - Date.parse(store.oldest)) / 1000;
      setStat("st-history", formatDuration(span),
              "since " + formatDate(Date.parse(store.oldest)));
    } else {
      setStat("st-history", "empty");
    }
    renderSync(s.sync);
    renderWear(s.wear);
    renderSystem(s.update);
    setStat("st-clock", clock.synchronized ? "synchronized" : "not synchronized", "",
            clock.synchronized ? "good" : "warn");
    $("clock-banner").hidden = clock.synchronized !== false;
    renderConfig(s.config, s.provisioning);
    for (const device of state.devices.values()) renderAge(device);
    tick();
  }

  function renderSync(sync) {
    if (!sync) {
      setStat("st-sync", "not configured");
      return;
    }
    const backlog = (sync.backlog || 0).toLocaleString("en") + " waiting";
    const last = sync.last_success
      ? "last upload " + formatDuration((gatewayNow() - Date.parse(sync.last_success)) / 1000) + " ago"
      : "no upload yet";
    const kind = sync.state === "retrying" || sync.health_only ? "warn"
      : sync.state === "ok" ? "good" : "";
    const budget = sync.budget_bytes
      ? " · " + formatBytes(sync.budget_used || 0) + " of " + formatBytes(sync.budget_bytes) +
        " today" + (sync.health_only ? ", health records only" : "")
      : "";
    // [sync] on_metered = "wait" on a metered link: say what it waits for
    const waiting = sync.waiting_for ? " · waits for " + sync.waiting_for : "";
    setStat("st-sync", sync.state + " · " + backlog, last + budget + waiting, kind,
            sync.last_error || "");
  }

  /** What the gateway writes to its SD card a day, and how long a card lasts at that. */
  function renderWear(wear) {
    if (!wear) {
      setStat("st-card", "–");
      return;
    }
    const card = wear.endurance_tb + " TB card";
    if (wear.bytes_per_day == null) {
      setStat("st-card", "measuring…", formatDuration(wear.measured_s) + " of " +
              formatDuration(wear.needs_s), "",
              "writes per day are projected after " + formatDuration(wear.needs_s) +
              " of measurement (the store's creation left out)");
      return;
    }
    const years = wear.life_years == null ? "" : "~" + wear.life_years.toLocaleString("en") +
      " years of a " + card;
    const kind = wear.life_years != null && wear.life_years < 5 ? "warn" : "";
    setStat("st-card", formatBytes(wear.bytes_per_day) + "/day over " +
            formatDuration(wear.measured_s), years, kind,
            "written to " + (wear.disk || "storage") + " over the last " +
            formatDuration(wear.measured_s));
  }

  /** The A/B system (shown on A/B images only): the slot running and the last update. */
  function renderSystem(update) {
    $("st-system-box").hidden = !(update && update.slot);
    if (!update || !update.slot) return;
    const last = update.last;
    if (update.trial) {
      setStat("st-system", "slot " + update.slot, update.trial.version + " on trial");
    } else if (!last) {
      setStat("st-system", "slot " + update.slot, "no update yet");
    } else if (last.result === "ok") {
      setStat("st-system", "slot " + update.slot, "update " + last.version + " kept", "good");
    } else {
      setStat("st-system", "slot " + update.slot, "update " + last.version + " not kept",
              "warn", last.reason);
    }
  }

  function setStat(id, text, small, kind, title) {
    const el = $(id);
    el.replaceChildren(text);
    if (small) el.append(" ", h("small", {}, small));
    el.className = "stat-value" + (kind ? " " + kind : "");
    el.title = title || "";
  }

  function gatewayNow() {
    return Date.now() + state.clockOffset;
  }

  /** Times on the page are the gateway's (its clock, this browser's time zone). */
  function tick() {
    $("gwtime").textContent = "gateway " + clockTime(gatewayNow(), true)
      + (state.clockSynced === false ? " (unsynchronized)" : "");
  }

  setInterval(() => {
    tick();
    for (const device of state.devices.values()) renderAge(device);
  }, 1000);

  // -- history ---------------------------------------------------------------------------

  function select(id, keepChart) {
    state.selected = id;
    for (const device of state.devices.values()) {
      device.el.setAttribute("aria-pressed", String(device.id === id));
    }
    history.replaceState(null, "", id ? "#" + encodeURIComponent(id) : location.pathname + location.search);
    const detail = $("detail");
    if (!id) {
      detail.hidden = true;
      state.chart = null;
      state.chartToken = null;
      return;
    }
    detail.hidden = false;
    $("detail-title").textContent = id;
    if (!keepChart || !state.chart || state.chart.device !== id) loadChart();
  }

  for (const button of document.querySelectorAll(".ranges button")) {
    button.addEventListener("click", () => {
      state.range = Number(button.dataset.range);
      loadChart();
    });
  }
  $("detail-close").addEventListener("click", () => select(null));

  /** Reads the selected device's history, newest first, a page at a time, back to the
   * start of the range (or MAX_POINTS), with reverse/limit/before_publication. */
  async function loadChart() {
    const id = state.selected;
    const range = state.range;
    const token = {};
    state.chartToken = token;
    for (const button of document.querySelectorAll(".ranges button")) {
      button.setAttribute("aria-pressed", String(Number(button.dataset.range) === range));
    }
    const session = state.session;
    if (!id || !session) return;
    $("detail-foot").textContent = "loading history…";
    try {
      const sub = await historySubscription();
      if (state.chartToken !== token) return;
      if (sub == null) {
        state.chart = { device: id, range, points: [], pages: 0, truncated: false };
        drawCharts("No history is kept for sensor topics (add a [[realms.history]] rule).");
        return;
      }
      const cutoff = gatewayNow() - range;
      const points = [];
      let before = null;
      let pages = 0;
      let truncated = false;
      for (;;) {
        const query = { reverse: true, limit: PAGE, topic: SENSOR_PREFIX + id };
        if (before !== null) query.before_publication = before;
        const page = pageOf(await session.call("wamp.subscription.get_events", [sub], query));
        if (state.chartToken !== token) return;
        pages += 1;
        let done = !page.more || page.events.length === 0;
        for (const event of page.events) {
          const t = Date.parse(event.timestamp);
          if (t < cutoff) {
            done = true;
            break;
          }
          points.push(pointOf(t, readingOf(event.args, event.kwargs)));
        }
        if (done) break;
        if (points.length >= MAX_POINTS) {
          truncated = true;
          break;
        }
        before = page.events[page.events.length - 1].publication;
      }
      points.reverse();
      state.chart = { device: id, range, points, pages, truncated };
      drawCharts();
    } catch (e) {
      if (state.chartToken === token) $("detail-foot").textContent =
        "Cannot read the history: " + errorText(e);
    }
  }

  function pageOf(result) {
    if (result instanceof autobahn.Result) {
      return { events: result.args[0] || [], more: Boolean(result.kwargs.is_limit_reached) };
    }
    return { events: result || [], more: false };
  }

  function pointOf(t, reading) {
    return { t, temperature: finite(reading.temperature), humidity: finite(reading.humidity) };
  }

  function drawCharts(message) {
    const chart = state.chart;
    if (!chart) return;
    for (const figure of document.querySelectorAll(".chart")) {
      drawSeries(figure, figure.dataset.series, chart, message);
    }
    const n = chart.points.length;
    $("detail-foot").textContent = message ? "" :
      plural(n, "reading") + " in the last " + rangeLabel(chart.range)
      + " · read in " + plural(chart.pages, "page")
      + (chart.truncated ? " · showing the newest " + MAX_POINTS : "")
      + (state.clockSynced === false ? " · times from an unsynchronized clock" : "");
  }

  function rangeLabel(range) {
    const button = document.querySelector(`.ranges button[data-range="${range}"]`);
    return button ? button.textContent : formatDuration(range / 1000);
  }

  const SVG = "http://www.w3.org/2000/svg";

  function drawSeries(figure, name, chart, message) {
    const spec = SERIES[name];
    const data = chart.points.filter((p) => p[name] !== null);
    const last = data.length ? data[data.length - 1][name] : null;
    const values = data.map((p) => p[name]);
    const caption = h("figcaption", {},
      h("span", {}, spec.label + " ", h("b", {}, number(last, spec.digits) + " " + spec.unit)),
      h("span", {}, data.length
        ? "min " + number(Math.min(...values), spec.digits) + " · max "
          + number(Math.max(...values), spec.digits)
        : ""));
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", spec.label + " history of " + chart.device);
    svg.dataset.points = String(data.length);
    figure.replaceChildren(caption, svg);
    const box = svg.getBoundingClientRect();
    const W = Math.max(box.width, 200);
    const H = Math.max(box.height, 120);
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const rem = parseFloat(getComputedStyle(document.documentElement).fontSize) || 16;
    const m = { left: 2.9 * rem, right: 0.9 * rem, top: 0.75 * rem, bottom: 1.65 * rem };
    if (!data.length) {
      svg.append(s("text", { class: "nodata", x: W / 2, y: H / 2, "text-anchor": "middle" },
                   message || "No readings in this range."));
      return;
    }
    const now = gatewayNow();
    let x0 = Math.max(now - chart.range, data[0].t);
    let x1 = Math.max(now, data[data.length - 1].t);
    if (x1 - x0 < 60000) x0 = x1 - 60000;
    const [y0, y1, yStep] = niceRange(Math.min(...values), Math.max(...values), 4);
    const X = (t) => m.left + ((t - x0) / (x1 - x0)) * (W - m.left - m.right);
    const Y = (v) => m.top + (1 - (v - y0) / (y1 - y0)) * (H - m.top - m.bottom);

    const grid = s("g", { class: "grid" });
    const axis = s("g", { class: "axis" });
    for (let v = y0; v <= y1 + yStep / 2; v += yStep) {
      grid.append(s("line", { x1: m.left, x2: W - m.right, y1: Y(v), y2: Y(v) }));
      axis.append(s("text", { x: m.left - 0.5 * rem, y: Y(v) + 0.25 * rem, "text-anchor": "end" },
                    number(v, Math.max(0, -Math.floor(Math.log10(yStep) + 1e-9)))));
    }
    const [tStep, label] = timeStep(x1 - x0, (W - m.left - m.right) / (4.7 * rem));
    const zone = -new Date(x0).getTimezoneOffset() * 60000; // ticks on local hours and days
    for (let t = Math.ceil((x0 + zone) / tStep) * tStep - zone; t <= x1; t += tStep) {
      if (X(t) < m.left + 1.2 * rem || X(t) > W - m.right - 1.2 * rem) continue;
      grid.append(s("line", { x1: X(t), x2: X(t), y1: m.top, y2: H - m.bottom }));
      axis.append(s("text", { x: X(t), y: H - 0.4 * rem, "text-anchor": "middle" }, label(t)));
    }
    const coords = data.map((p) => `${X(p.t).toFixed(1)},${Y(p[name]).toFixed(1)}`);
    const first = data[0];
    const end = data[data.length - 1];
    const area = s("path", {
      class: "area",
      d: `M${X(first.t).toFixed(1)},${Y(y0)} L${coords.join(" L")} L${X(end.t).toFixed(1)},${Y(y0)} Z`,
    });
    const line = s("polyline", { class: "line", points: coords.join(" ") });
    const dot = s("circle", { class: "dot", cx: X(end.t), cy: Y(end[name]), r: 4.5 });
    svg.append(grid, area, line, dot, axis, hoverLayer(svg, data, name, spec, X, Y, m, H, rem));
  }

  /** A crosshair with the nearest reading's value and time under the pointer. */
  function hoverLayer(svg, data, name, spec, X, Y, m, H, rem) {
    const layer = s("g", { class: "hover", visibility: "hidden" });
    const rule = s("line", { y1: m.top, y2: H - m.bottom, stroke: "#93a5b8",
                             "stroke-dasharray": "3 3" });
    const dot = s("circle", { class: "dot", r: 5 });
    const text = s("text", {});
    layer.append(rule, dot, text);
    svg.addEventListener("pointermove", (event) => {
      const box = svg.getBoundingClientRect();
      const x = event.clientX - box.left;
      let best = data[0];
      for (const p of data) if (Math.abs(X(p.t) - x) < Math.abs(X(best.t) - x)) best = p;
      const px = X(best.t);
      rule.setAttribute("x1", px);
      rule.setAttribute("x2", px);
      dot.setAttribute("cx", px);
      dot.setAttribute("cy", Y(best[name]));
      text.textContent = number(best[name], spec.digits) + " " + spec.unit + "  "
        + clockTime(best.t, true);
      const right = px > box.width / 2;
      text.setAttribute("x", right ? px - 0.5 * rem : px + 0.5 * rem);
      text.setAttribute("y", m.top + 0.8 * rem);
      text.setAttribute("text-anchor", right ? "end" : "start");
      layer.setAttribute("visibility", "visible");
    });
    svg.addEventListener("pointerleave", () => layer.setAttribute("visibility", "hidden"));
    return layer;
  }

  function niceRange(lo, hi, ticks) {
    if (hi - lo < 1) {
      const mid = (hi + lo) / 2;
      lo = mid - 0.5;
      hi = mid + 0.5;
    }
    const raw = (hi - lo) / ticks;
    const magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((f) => f * magnitude).find((v) => v >= raw);
    return [Math.floor(lo / step) * step, Math.ceil(hi / step) * step, step];
  }

  function timeStep(span, maxTicks) {
    const minute = 60000;
    const hour = 60 * minute;
    const steps = [10000, 30000, minute, 2 * minute, 5 * minute, 10 * minute, 15 * minute,
                   30 * minute, hour, 2 * hour, 3 * hour, 6 * hour, 12 * hour, 24 * hour,
                   48 * hour, 7 * 24 * hour];
    const step = steps.find((v) => span / v <= Math.max(maxTicks, 2)) || steps[steps.length - 1];
    const label = step >= 24 * hour
      ? (t) => new Date(t).toLocaleDateString([], { weekday: "short", day: "numeric" })
      : (t) => clockTime(t, step < minute);
    return [step, label];
  }

  function clockTime(ms, seconds) {
    const d = new Date(ms);
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + (seconds ? ":" + pad(d.getSeconds()) : "");
  }

  new ResizeObserver(() => requestAnimationFrame(() => {
    if (!$("detail").hidden) drawCharts();
  })).observe($("detail"));

  function renderConfig(config, provisioning) {
    const banner = $("config-banner");
    const refused = provisioning && ["refused", "failed"].includes(provisioning.outcome);
    if (config && config.running === "last-good") {
      banner.textContent = "Running on the last good configuration: " + (config.problem || "");
    } else if (config && config.problem) {
      banner.textContent = "The configuration file was not applied: " + config.problem;
    } else if (refused) {
      banner.textContent = "The settings on the card's boot partition were not applied (" +
        provisioning.outcome + "; see cairn/report.txt there): " +
        provisioning.problems.join("; ");
    } else {
      banner.hidden = true;
      return;
    }
    banner.hidden = false;
  }

  // -- settings (for a session that may call cairn.admin.config.*) -------------------------

  function probeSettings(session, generation) {
    $("settings-open").hidden = true;
    session.call("cairn.admin.config.get").then((got) => {
      if (generation !== state.generation) return;
      $("settings-open").hidden = false;
      state.settings = got;
    }, () => { /* not an admin: no settings */ });
  }

  function loadSettings(keepText) {
    const session = state.session;
    if (!session) return Promise.resolve(null);
    return session.call("cairn.admin.config.get").then((got) => {
      state.settings = got;
      $("settings-file").textContent = got.file + (got.running === "last-good"
        ? " (running on the last good configuration)" : "");
      if (!keepText) $("settings-text").value = got.text || "";
      renderChanges(got);
      return got;
    }, (e) => setResult("error", "Cannot read the configuration: " + errorText(e)));
  }

  function renderChanges(got) {
    const items = (got.requests || []).map((r) =>
      h("li", {}, `request ${r.id}: pending (${r.action}), by ${r.by}, ${r.at}`));
    for (const c of got.changes || []) {
      items.push(h("li", { "data-state": c.state },
        `${c.id}: ${c.state.replace("_", " ")}${c.action ? " (" + c.action + ")" : ""}, by ` +
        `${c.by}, ${c.at}${c.reason ? " — " + c.reason : ""}`));
    }
    $("settings-history").replaceChildren(...items);
  }

  function setResult(kind, text) {
    const el = $("settings-result");
    el.dataset.kind = kind;
    el.textContent = text;
  }

  function applySettings() {
    const session = state.session;
    if (!session) return;
    setResult("", "Checking…");
    session.call("cairn.admin.config.apply", [$("settings-text").value]).then((answer) => {
      setResult("", `Request ${answer.request} accepted: waiting for the gateway to ` +
                    `${answer.action} (it rolls back by itself if the router is not ready)…`);
      awaitRequest(answer.request, 0);
    }, (e) => {
      const k = e.kwargs || {};
      setResult("error", k.key ? `Not applied: ${k.file}: ${k.key}: ${k.problem}`
                                : "Not applied: " + errorText(e));
    });
  }

  function awaitRequest(id, tries) {
    setTimeout(() => loadSettings(true).then((got) => {
      const change = got && (got.changes || []).find((c) => c.request === id);
      if (change && change.state !== "pending") {
        setResult(change.state === "good" ? "good" : "error",
                  `Change ${change.id}: ${change.state.replace("_", " ")}` +
                  (change.reason ? ": " + change.reason : ""));
        if (change.state === "good") loadSettings(false);
      } else if (tries < 90) {
        awaitRequest(id, tries + 1);
      }
    }), 2000);
  }

  $("settings-open").addEventListener("click", () => {
    $("settings").hidden = false;
    setResult("", "");
    loadSettings(false);
  });
  $("settings-close").addEventListener("click", () => { $("settings").hidden = true; });
  $("settings-reload").addEventListener("click", () => loadSettings(false));
  $("settings-apply").addEventListener("click", applySettings);

  // -- helpers ---------------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
    el.append(...children);
    return el;
  }

  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
    el.append(...children);
    return el;
  }

  function guarded(fn) {
    return function (...args) {
      try {
        return fn(...args);
      } catch (e) {
        showError("Dashboard error: " + errorText(e));
        return undefined;
      }
    };
  }

  function showError(text) {
    const el = $("error-banner");
    el.textContent = text;
    el.hidden = false;
  }

  function hideError() {
    $("error-banner").hidden = true;
  }

  function errorText(e) {
    if (e && e.error) return e.error + (e.args && e.args.length ? ": " + e.args[0] : "");
    return String(e && e.message ? e.message : e);
  }

  function finite(v) {
    return typeof v === "number" && Number.isFinite(v) ? v : null;
  }

  function number(v, digits) {
    return typeof v === "number" && Number.isFinite(v)
      ? v.toFixed(digits).replace("-", "−") : "–";
  }

  function plural(n, word) {
    return (n ?? 0).toLocaleString("en") + " " + word + (n === 1 ? "" : "s");
  }

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  function formatDuration(seconds) {
    if (!Number.isFinite(seconds)) return "–";
    seconds = Math.max(0, Math.round(seconds));
    if (seconds < 60) return seconds + " s";
    const minutes = Math.floor(seconds / 60);
    if (minutes < 60) return minutes + " min";
    const hours = Math.floor(minutes / 60);
    if (hours < 24) return hours + " h" + (minutes % 60 ? " " + (minutes % 60) + " min" : "");
    const days = Math.floor(hours / 24);
    return days + " d" + (hours % 24 ? " " + (hours % 24) + " h" : "");
  }

  function formatBytes(n) {
    if (typeof n !== "number") return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return (i && n < 10 ? n.toFixed(1) : Math.round(n)) + " " + units[i];
  }

  function formatDate(ms) {
    const d = new Date(ms);
    return d.toLocaleDateString([], { month: "short", day: "numeric" }) + " "
      + pad(d.getHours()) + ":" + pad(d.getMinutes());
  }

  function intParam(name, lo, hi, fallback) {
    const v = Number.parseInt(params.get(name), 10);
    return Number.isInteger(v) && v >= lo && v <= hi ? v : fallback;
  }

  // -- start -----------------------------------------------------------------------------

  $("realm").textContent = REALM;
  if (location.hash.length > 1) state.selected = decodeURIComponent(location.hash.slice(1));
  if (typeof autobahn === "undefined") {
    showError("The dashboard's WAMP client (autobahn.min.js) is missing: run scripts/setup.sh "
              + "on the gateway to build it.");
    setConnection("offline", "offline");
    return;
  }
  tick();
  connect();
})();
