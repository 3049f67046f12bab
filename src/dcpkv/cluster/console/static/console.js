// The dcpkv web console: polls the manager's JSON (api/overview every second, api/dcp every
// five) and draws it. Its only writes are the admin API's routes (rebalance, stop, failover,
// recovery), each after a confirmation. Preact + htm, uPlot for the charts: vendor/README.md.
import { h, render } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import htm from "htm";

const html = htm.bind(h);
const OVERVIEW_MS = 1000;
const DCP_MS = 5000;
const HISTORY_S = 300; // what the charts keep: five minutes

// -- talking to the manager -------------------------------------------------------------------

async function answer(response) {
  const doc = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(doc.error || `HTTP ${response.status}`);
  return doc;
}

const getJson = (path) => fetch(path, { cache: "no-store" }).then(answer);

const postForm = (path, params = {}) =>
  fetch(path, { method: "POST", body: new URLSearchParams(params) }).then(answer);

function usePoll(path, everyMs) {
  const [state, setState] = useState({ doc: null, error: null });
  useEffect(() => {
    let alive = true;
    let timer = null;
    const tick = async () => {
      try {
        const doc = await getJson(path);
        if (alive) setState({ doc, error: null });
      } catch (e) {
        if (alive) setState((s) => ({ doc: s.doc, error: e.message }));
      }
      if (alive) timer = setTimeout(tick, everyMs);
    };
    tick();
    return () => {
      alive = false;
      clearTimeout(timer);
    };
  }, [path, everyMs]);
  return state;
}

// -- formatting -------------------------------------------------------------------------------

const num = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function secs(s) {
  if (s === null || s === undefined) return "–";
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} min ${Math.round(s % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

const clock = (epoch) => new Date(epoch * 1000).toLocaleTimeString("en-GB");

// -- pieces -----------------------------------------------------------------------------------

const STATUS_CLASS = { healthy: "ok", unhealthy: "bad", failedOver: "bad", unknown: "warn" };

function Badge({ status }) {
  return html`<span class="badge ${STATUS_CLASS[status] || "warn"}">${status}</span>`;
}

function Panel({ title, id, children, wide }) {
  return html`<section class="panel ${wide ? "wide" : ""}" id=${id} aria-labelledby="${id}-h">
    <h2 id="${id}-h">${title}</h2>
    ${children}
  </section>`;
}

function Confirm({ ask, onDone }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const go = async () => {
    setBusy(true);
    setError(null);
    try {
      await ask.run();
      onDone(`${ask.label}: the manager accepted it`);
    } catch (e) {
      setError(e.message);
      setBusy(false);
    }
  };
  return html`<div class="backdrop">
    <div class="modal" role="dialog" aria-modal="true" aria-labelledby="confirm-h">
      <h3 id="confirm-h">${ask.label}?</h3>
      <p>${ask.text}</p>
      ${error && html`<p class="error" role="alert">${error}</p>`}
      <div class="buttons">
        <button onClick=${() => onDone(null)} disabled=${busy}>Cancel</button>
        <button class="danger" onClick=${go} disabled=${busy}>${ask.label}</button>
      </div>
    </div>
  </div>`;
}

// -- the panels -------------------------------------------------------------------------------

function Summary({ doc }) {
  const members = doc.nodes.filter((n) => n.clusterMembership === "active");
  const healthy = members.filter((n) => n.status === "healthy").length;
  const failed = doc.nodes.length - members.length;
  const items = doc.buckets.reduce((sum, b) => sum + b.items, 0);
  const cards = [
    ["Nodes", `${members.length} active${failed ? `, ${failed} failed over` : ""}`, "nodes"],
    ["Healthy", `${healthy} of ${members.length}`, "healthy"],
    ["Buckets", doc.buckets.map((b) => b.name).join(", ") || "none", "buckets"],
    ["Items", num(items), "items"],
    ["Rebalance", doc.rebalance.state, "rebalance"],
  ];
  return html`<div class="cards">
    ${cards.map(([k, v, id]) => html`<div class="card" data-testid="card-${id}"><span>${k}</span><strong>${v}</strong></div>`)}
  </div>`;
}

function Nodes({ doc, ask }) {
  const canFail = doc.nodes.filter((n) => n.clusterMembership === "active").length > 1;
  return html`<table class="grid" data-testid="nodes">
    <thead><tr>
      <th>node</th><th>membership</th><th>health</th><th>in sync</th><th>actives</th>
      <th>replicas</th><th>items</th><th>memory</th><th>persistence lag</th><th></th>
    </tr></thead>
    <tbody>
      ${doc.nodes.map((n) => html`<tr data-testid="node-row" data-node=${n.hostname}>
        <td class="name">${n.hostname}</td>
        <td>${n.clusterMembership}</td>
        <td><${Badge} status=${n.status} />${n.diskError ? html` <span class="badge bad" title=${n.diskError}>disk</span>` : ""}</td>
        <td>${n.inSync ? "yes" : "no"}</td>
        <td class="n">${num(n.actives)}</td>
        <td class="n">${num(n.replicas)}</td>
        <td class="n">${n.answered ? num(n.items) : "–"}</td>
        <td class="n">${n.answered ? bytes(n.memUsed) : "–"}</td>
        <td class="n">${n.persistenceLagMs === null ? "–" : `${num(n.persistenceLagMs)} ms`}</td>
        <td>${n.clusterMembership === "active" && canFail && html`<button class="small danger"
          onClick=${() => ask({
            label: `Fail over ${n.hostname}`,
            text: `Its vbuckets become active on their replicas and it leaves the map. Writes it acknowledged but did not replicate may be lost if it is still running.`,
            run: () => postForm("/controller/failOver", { otpNode: n.hostname }),
          })}>Fail over</button>`}</td>
      </tr>`)}
    </tbody>
  </table>`;
}

function Distribution({ doc }) {
  const rows = doc.nodes.filter((n) => n.clusterMembership === "active");
  const most = Math.max(1, ...rows.map((n) => n.actives + n.replicas));
  return html`<div class="bars" data-testid="distribution">
    ${rows.map((n) => html`<div class="bar-row" data-node=${n.hostname}>
      <span class="name">${n.hostname}</span>
      <span class="bar">
        <span class="active" style=${{ width: `${(100 * n.actives) / most}%` }} title="${n.actives} active"></span>
        <span class="replica" style=${{ width: `${(100 * n.replicas) / most}%` }} title="${n.replicas} replica"></span>
      </span>
      <span class="n">${n.actives} / ${n.replicas}</span>
    </div>`)}
    <p class="legend"><span class="key active"></span> active <span class="key replica"></span> replica (actives / replicas per node)</p>
  </div>`;
}

function Rebalance({ doc, ask }) {
  const r = doc.rebalance;
  const p = r.progress;
  const running = r.state === "running";
  const pct = p.vbucketsTotal ? Math.floor((100 * p.vbucketsMoved) / p.vbucketsTotal) : 0;
  const pending = [...r.eject.map((n) => `eject ${n}`), ...Object.entries(r.recover).map(([n, how]) => `recover ${n} (${how})`)];
  const unplaced = doc.nodes.some((n) => n.clusterMembership === "active" && n.actives + n.replicas === 0);
  return html`<div data-testid="rebalance">
    <p>State: <strong data-testid="rebalance-state">${r.state}</strong>${r.error ? html` <span class="error">${r.error}</span>` : ""}</p>
    ${p.vbucketsTotal > 0 && html`<div class="progress-line">
      <progress max=${p.vbucketsTotal} value=${p.vbucketsMoved}></progress>
      <span data-testid="rebalance-progress">${p.vbucketsMoved} of ${p.vbucketsTotal} vbuckets moved (${pct}%)</span>
    </div>
    <dl class="facts">
      <dt>items transferred</dt><dd>${num(p.itemsTransferred)}</dd>
      <dt>elapsed</dt><dd>${secs(p.elapsed)}</dd>
      <dt>estimated remaining</dt><dd data-testid="rebalance-eta">${running ? secs(p.eta) : "–"}</dd>
      <dt>moving now</dt><dd>${Object.keys(p.moving).length}</dd>
    </dl>`}
    ${pending.length > 0 && html`<p>Waiting for the next rebalance: ${pending.join(", ")}</p>`}
    ${unplaced && !running && html`<p class="hint">A node holds no vbuckets yet: a rebalance gives it its share.</p>`}
    <div class="buttons">
      ${running
        ? html`<button class="danger" onClick=${() => ask({
            label: "Stop the rebalance",
            text: "Moves under way are put back; the moves already done stay. Rebalancing again finishes the job.",
            run: () => postForm("/controller/stopRebalance"),
          })}>Stop rebalance</button>`
        : html`<button onClick=${() => ask({
            label: "Rebalance",
            text: "vbuckets move between the nodes until every node has its share (and nodes marked to leave or come back do so). The cluster keeps serving meanwhile.",
            run: () => postForm("/controller/rebalance"),
          })}>Rebalance</button>`}
    </div>
  </div>`;
}

function Failover({ doc, ask }) {
  const f = doc.failover;
  const recover = (node, how) => ask({
    label: `Recover ${node} (${how})`,
    text: how === "delta"
      ? "It comes back keeping its data: its copies roll back where needed and catch up, then a rebalance gives it its share."
      : "Its vbuckets are deleted first and copied again in full by a rebalance.",
    run: async () => {
      await postForm("/controller/setRecoveryType", { otpNode: node, recoveryType: how });
      return postForm("/controller/rebalance");
    },
  });
  const held = Object.entries(f.held);
  return html`<div data-testid="failover">
    <p>Automatic failover: <strong>${f.enabled ? `on, after ${f.timeout} s` : "off"}</strong>${` (${f.count} of ${f.maxCount} used)`}</p>
    ${f.failedOver.length > 0
      ? html`<ul class="failed" data-testid="failed-over">
          ${f.failedOver.map((n) => html`<li data-node=${n}>
            <span class="badge bad">failed over</span> <span class="name">${n}</span>
            ${f.recovery[n] ? html` marked for ${f.recovery[n]} recovery` : html`
              <button class="small" onClick=${() => recover(n, "delta")}>Recover (delta)</button>
              <button class="small" onClick=${() => recover(n, "full")}>Recover (full)</button>`}
          </li>`)}
        </ul>`
      : html`<p class="quiet" data-testid="no-failed-over">No node is failed over.</p>`}
    ${held.length > 0 && html`<p>Not failed over automatically: ${held.map(([n, why]) => `${n}: ${why}`).join("; ")}</p>`}
    <h3>Automatic failovers</h3>
    ${f.events.length > 0
      ? html`<table class="grid" data-testid="failover-events"><thead><tr><th>time</th><th>node</th><th>reason</th></tr></thead>
          <tbody>${[...f.events].reverse().map((e) => html`<tr><td>${clock(e.at)}</td><td class="name">${e.node}</td><td>${e.reason}</td></tr>`)}</tbody>
        </table>`
      : html`<p class="quiet">None.</p>`}
  </div>`;
}

function Dcp({ state }) {
  if (!state.doc) return html`<p class="quiet">${state.error || "Asking the nodes…"}</p>`;
  const nodes = state.doc.nodes;
  if (!nodes.length) return html`<p class="quiet">No node to ask.</p>`;
  return html`<div data-testid="dcp">
    ${state.error && html`<p class="error">${state.error}</p>`}
    ${nodes.map((n) => {
      const total = n.connections.reduce((s, c) => s + c.backlog, 0);
      const shown = [...n.connections].sort((a, b) => b.backlog - a.backlog).slice(0, 20);
      return html`<details open data-node=${n.node}>
        <summary><span class="name">${n.node}</span>${` · ${n.bucket} · `}${n.answered ? `${n.connections.length} connection(s), backlog ${num(total)} item(s)` : "not answering"}</summary>
        ${shown.length > 0 && html`<table class="grid">
          <thead><tr><th>connection</th><th>type</th><th>streams</th><th>backfilling</th><th>items sent</th><th>bytes sent</th><th>backlog</th></tr></thead>
          <tbody>${shown.map((c) => html`<tr>
            <td class="name">${c.name}</td><td>${c.type}</td><td class="n">${c.streams}</td>
            <td class="n">${c.backfilling}</td><td class="n">${num(c.itemsSent)}</td>
            <td class="n">${bytes(c.bytesSent)}</td><td class="n">${num(c.backlog)}</td>
          </tr>`)}</tbody>
        </table>`}
        ${n.connections.length > shown.length && html`<p class="quiet">${n.connections.length - shown.length} more with less backlog</p>`}
      </details>`;
    })}
  </div>`;
}

function Chart({ title, t, v }) {
  const box = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const width = () => Math.max(240, box.current.clientWidth);
    plot.current = new uPlot({
      title,
      width: width(),
      height: 180,
      scales: { x: { time: true } },
      series: [{}, { label: title, stroke: "#2563eb", fill: "rgba(37,99,235,0.08)", width: 2 }],
      legend: { show: false },
    }, [[], []], box.current);
    const resized = new ResizeObserver(() => plot.current.setSize({ width: width(), height: 180 }));
    resized.observe(box.current);
    return () => {
      resized.disconnect();
      plot.current.destroy();
    };
  }, [title]);
  useEffect(() => {
    plot.current.setData([t, v]);
  }, [t, v]);
  return html`<div class="chart" ref=${box}></div>`;
}

function Charts({ doc, history }) {
  return html`<div class="charts">
    ${doc.buckets.map((b) => {
      const s = history[b.name] || { t: [], rate: [], items: [] };
      return html`<div class="bucket-charts" data-testid="charts-${b.name}">
        <h3>${b.name}: ${b.mutationsPerSec === null ? "–" : num(Math.round(b.mutationsPerSec))} mutations/s · ${num(b.items)} items</h3>
        <div class="chart-pair">
          <${Chart} title="${b.name}: mutations/s" t=${s.t} v=${s.rate} />
          <${Chart} title="${b.name}: items" t=${s.t} v=${s.items} />
        </div>
      </div>`;
    })}
  </div>`;
}

// -- the page ---------------------------------------------------------------------------------

function remember(history, doc) {
  for (const b of doc.buckets) {
    const s = history[b.name] || { t: [], rate: [], items: [] };
    if (s.t.length && s.t[s.t.length - 1] >= doc.at) continue;
    const keep = (a, x) => [...a.filter((_, i) => s.t[i] > doc.at - HISTORY_S), x];
    history[b.name] = {
      t: keep(s.t, doc.at),
      rate: keep(s.rate, b.mutationsPerSec),
      items: keep(s.items, b.items),
    };
  }
}

function App() {
  const overview = usePoll("/ui/api/overview", OVERVIEW_MS);
  const dcp = usePoll("/ui/api/dcp", DCP_MS);
  const history = useRef({});
  const [asking, setAsking] = useState(null);
  const [notice, setNotice] = useState(null);
  const doc = overview.doc;
  if (doc) remember(history.current, doc);
  const done = (message) => {
    setAsking(null);
    if (message) setNotice(message);
  };
  return html`<header>
      <h1>dcpkv cluster</h1>
      <span class="manager" data-testid="managers">${doc && doc.managers ? `leader: ${doc.managers.leader}` : "one manager"}</span>
      <span class="updated">${doc ? `updated ${clock(doc.at)}` : ""}</span>
    </header>
    ${overview.error && html`<p class="error banner" role="alert">The manager did not answer: ${overview.error}</p>`}
    ${notice && html`<p class="notice banner" role="status">${notice} <button class="small" onClick=${() => setNotice(null)}>×</button></p>`}
    ${doc
      ? html`<main>
          <${Summary} doc=${doc} />
          <${Panel} title="Nodes" id="nodes" wide><${Nodes} doc=${doc} ask=${setAsking} /><//>
          <${Panel} title="vbuckets per node" id="distribution"><${Distribution} doc=${doc} /><//>
          <${Panel} title="Rebalance" id="rebalance"><${Rebalance} doc=${doc} ask=${setAsking} /><//>
          <${Panel} title="Failover" id="failover"><${Failover} doc=${doc} ask=${setAsking} /><//>
          <${Panel} title="Buckets" id="charts" wide><${Charts} doc=${doc} history=${history.current} /><//>
          <${Panel} title="DCP connections" id="dcp" wide><${Dcp} state=${dcp} /><//>
        </main>`
      : html`<p class="loading">Asking the manager…</p>`}
    ${asking && html`<${Confirm} ask=${asking} onDone=${done} />`}`;
}

render(html`<${App} />`, document.getElementById("app"));
