// The "Adapt" tab of TensorBoard: an ES module that TensorBoard loads in an
// iframe (base href /data/plugin/adapt/) and whose render() it calls.
//
// Charts are hand-written SVG: no framework, no CDN, no request other than
// this plugin's own JSON routes. Every piece of data (run names, tags,
// reasons, before/after values) reaches the page through textContent or
// setAttribute and is never parsed as HTML, so a run named
// `<img src=x onerror=alert(1)>` shows as text.

const SVG_NS = 'http://www.w3.org/2000/svg';
const MAX_POINTS = 800;

// The colour of each event kind, as the runs route serves them
// (keras_adapt.record.metadata.EVENT_COLORS, the report's too); a kind the
// route does not know (from a newer writer) gets its unknown colour.
let kindColors = {};
let unknownColor = '#7f7f7f';

const TAG = (key) => 'adapt/' + key;
// Per-worker times, adapt/<time>/rank_<r> (metadata.WORKER_TIMES): step time
// (AdaptTensorBoard or WorkerTimingMonitor), compute time and wait in the
// collectives (WorkerTimingMonitor), one chart each, one line per worker.
const WORKER_TIME_CHARTS = [
  ['step_time', 'Step time per worker (s)'],
  ['compute_time', 'Worker timing: compute time per worker (s)'],
  ['wait_time', 'Worker timing: wait in collectives per worker (s)'],
];
// SystemMonitor's host metrics: adapt/system/host_<h>/<metric>
// (keras_adapt.record.metadata.SYSTEM_METRICS), one chart per metric.
const SYSTEM_PREFIX = 'adapt/system/host_';
const SYSTEM_CHARTS = [
  ['cpu_percent', 'System: CPU use (% of all cores)'],
  ['memory_percent', 'System: memory use (%)'],
  ['net_in_mb_s', 'System: network in (MB/s)'],
  ['net_out_mb_s', 'System: network out (MB/s)'],
  ['gpu_percent', 'System: GPU use (%, mean over GPUs)'],
  ['gpu_memory_percent', 'System: GPU memory (%, mean over GPUs)'],
];

const STYLE = `
  body { font-family: Roboto, Arial, sans-serif; margin: 12px 16px; color: #212121; }
  .adapt-bar { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; }
  .adapt-bar h2 { margin: 0 8px 0 0; font-size: 18px; font-weight: 500; }
  .adapt-status { color: #616161; font-size: 13px; }
  .adapt-legend { display: flex; gap: 10px; flex-wrap: wrap; margin: 8px 0; font-size: 12px; }
  span.swatch { display: inline-block; width: 10px; height: 10px;
    margin-right: 4px; border-radius: 2px; vertical-align: middle; }
  .adapt-charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr));
    gap: 12px; }
  .adapt-card { border: 1px solid #e0e0e0; border-radius: 4px; padding: 8px; background: #fff; }
  .adapt-card h3 { margin: 0 0 4px 0; font-size: 14px; font-weight: 500; }
  .adapt-card svg { width: 100%; height: auto; display: block; }
  .adapt-card .axis { font-size: 10px; fill: #616161; }
  .adapt-card .grid { stroke: #eeeeee; }
  .adapt-card .empty { font-size: 12px; fill: #9e9e9e; }
  .adapt-series-legend { font-size: 11px; color: #424242; display: flex; gap: 10px; }
  table.adapt-events { border-collapse: collapse; font-size: 12px; margin-top: 8px; width: 100%; }
  table.adapt-events th, table.adapt-events td { border-bottom: 1px solid #eeeeee;
    padding: 3px 6px; text-align: left; vertical-align: top; }
  table.adapt-events td.adapt-kind { white-space: nowrap; }
  table.adapt-events td.mono { font-family: monospace; white-space: pre-wrap; word-break: break-word; }
  .adapt-tooltip { position: fixed; pointer-events: none; background: rgba(33,33,33,0.92);
    color: #fff; font-size: 12px; padding: 6px 8px; border-radius: 3px; max-width: 420px;
    white-space: pre-wrap; display: none; z-index: 10; }
  .adapt-error { color: #b71c1c; font-size: 13px; }
`;

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = String(text);
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = String(text);
  return node;
}

function kindColor(kind) {
  return Object.prototype.hasOwnProperty.call(kindColors, kind) ? kindColors[kind] : unknownColor;
}

// A number for people: integers as integers, others with up to 4
// significant digits (0.019999999552965164 -> 0.02), very large or small
// ones in exponent form. The exact value stays in the cell's title.
function fmt(v) {
  if (typeof v !== 'number' || !Number.isFinite(v)) return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-4) return v.toExponential(3).replace(/\.?0+e/, 'e');
  return String(Number(v.toPrecision(4)));
}

// "batch_size: 64, lr: 0.02" from {"batch_size": 64, "lr": 0.019999999552965164}.
// A strategy with its parameters reads "local_sgd (period: 8)" from
// {"sync_strategy": "local_sgd", "period": 8} (sync_strategy events).
function formatValues(obj) {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) return compact(obj);
  if (typeof obj.sync_strategy === 'string') {
    const {sync_strategy: name, ...params} = obj;
    return Object.keys(params).length ? `${name} (${formatValues(params)})` : name;
  }
  const parts = Object.entries(obj).map(([k, v]) => {
    if (typeof v === 'number') return `${k}: ${fmt(v)}`;
    if (typeof v === 'string') return `${k}: ${v}`;
    return `${k}: ${compact(v)}`;
  });
  return parts.length ? parts.join(', ') : '–';
}

function compact(obj) {
  try {
    return JSON.stringify(obj);
  } catch (e) {
    return String(obj);
  }
}

async function getJson(path) {
  const response = await fetch(path, {credentials: 'same-origin'});
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${path}: HTTP ${response.status}`);
  return body;
}

// -- tooltip ------------------------------------------------------------------

let tooltip = null;

function showTooltip(evt, blocks) {
  tooltip.textContent = blocks.join('\n\n');
  tooltip.style.display = 'block';
  const x = Math.min(evt.clientX + 12, window.innerWidth - 430);
  tooltip.style.left = `${Math.max(0, x)}px`;
  tooltip.style.top = `${evt.clientY + 12}px`;
}

function hideTooltip() {
  tooltip.style.display = 'none';
}

function eventLines(e) {
  return [
    `${e.kind}${e.known === false ? ' (unknown kind)' : ''} at step ${e.step} (epoch ${e.epoch})`,
    `policy: ${e.policy}`,
    `reason: ${e.reason}`,
    `before: ${formatValues(e.before)}`,
    `after:  ${formatValues(e.after)}`,
  ];
}

// -- charts -------------------------------------------------------------------

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(t);
  return ticks;
}

/**
 * Draws one chart into `card`.
 * spec: {id, title, series: [{name, color, points: [[step, wall, value]], step}],
 *        logY, integer (whole-number ticks), events, xDomain,
 *        categories ([[value, label]]: one labelled tick per value, nothing else)}
 */
function drawChart(card, spec) {
  const W = 560, H = 220, R = 12, T = 10, B = 26;
  const L = spec.categories ? 112 : 56;  // room for names as y labels
  const root = svg('svg', {viewBox: `0 0 ${W} ${H}`, 'data-chart': spec.id, role: 'img'});
  root.appendChild(svg('title', {}, spec.title));
  const usable = (v) => v !== null && Number.isFinite(v) && (!spec.logY || v > 0);
  const ys = [];
  for (const s of spec.series) for (const p of s.points) if (usable(p[2])) ys.push(p[2]);
  const [x0, x1] = spec.xDomain;
  const sx = (x) => L + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - L - R);

  if (!ys.length) {
    root.appendChild(svg('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty'},
                         'no data in this run'));
  } else {
    let lo = Math.min(...ys), hi = Math.max(...ys);
    const tf = spec.logY ? Math.log10 : (v) => v;
    let tlo = tf(lo), thi = tf(hi);
    if (spec.categories) {
      // Half a row above and below the outer categories.
      const values = spec.categories.map((c) => c[0]);
      tlo = Math.min(lo, ...values) - 0.5;
      thi = Math.max(hi, ...values) + 0.5;
    } else if (thi - tlo < 1e-12) {
      // A constant series (a fixed lr, one worker): centre it in a band
      // proportional to its value.
      const half = spec.logY ? 0.5
        : spec.integer ? 1 : (Math.abs(tlo) > 0 ? Math.abs(tlo) * 0.5 : 1);
      tlo -= half;
      thi += half;
    }
    const pad = spec.categories ? 0 : (thi - tlo) * 0.06;
    tlo -= pad; thi += pad;
    if (!spec.logY && !spec.categories && lo >= 0 && tlo < 0) tlo = 0;
    const sy = (v) => T + (1 - (tf(v) - tlo) / (thi - tlo)) * (H - T - B);

    // grid and axes
    let yTicks = spec.logY
      ? niceTicks(Math.ceil(tlo), Math.floor(thi), 5).filter((t) => Number.isInteger(t)).map((t) => Math.pow(10, t))
      : niceTicks(tlo, thi, 4);
    // Whole-number series (workers): whole-number ticks only.
    if (spec.integer) yTicks = yTicks.filter((t) => Math.abs(t - Math.round(t)) < 1e-9).map(Math.round);
    if (spec.logY && yTicks.length < 2) {
      // Less than a decade: label plain values instead of powers of ten.
      yTicks = niceTicks(Math.pow(10, tlo), Math.pow(10, thi), 4).filter((t) => t > 0);
    }
    const yLabels = new Map(spec.categories || []);
    if (spec.categories) yTicks = spec.categories.map((c) => c[0]);
    for (const t of yTicks) {
      const y = sy(t);
      if (y < T - 1 || y > H - B + 1) continue;
      root.appendChild(svg('line', {x1: L, x2: W - R, y1: y, y2: y, class: 'grid'}));
      root.appendChild(svg('text', {x: L - 4, y: y + 3, 'text-anchor': 'end', class: 'axis'},
                           yLabels.has(t) ? yLabels.get(t) : fmt(t)));
    }
    for (const t of niceTicks(x0, x1, 6)) {
      const x = sx(t);
      root.appendChild(svg('text', {x, y: H - 8, 'text-anchor': 'middle', class: 'axis'}, fmt(t)));
    }
    root.appendChild(svg('line', {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#9e9e9e'}));
    root.appendChild(svg('line', {x1: L, x2: L, y1: T, y2: H - B, stroke: '#9e9e9e'}));

    for (const s of spec.series) {
      let d = '';
      let prev = null;
      for (const p of s.points) {
        if (!usable(p[2])) { prev = null; continue; }
        const x = sx(p[0]).toFixed(1), y = sy(p[2]).toFixed(1);
        if (prev === null) d += `M${x},${y}`;
        else if (s.step) d += `H${x}V${y}`;
        else d += `L${x},${y}`;
        prev = p;
      }
      if (!d) continue;
      const path = svg('path', {d, fill: 'none', stroke: s.color, 'stroke-width': 1.6,
                                 class: 'adapt-series', 'data-series': s.name});
      path.appendChild(svg('title', {}, s.name));
      root.appendChild(path);
    }
  }

  // One vertical marker per event, coloured by kind; the events of one
  // step stand side by side, and hovering any of them lists them all. A
  // wide transparent twin catches the mouse.
  const byStep = new Map();
  for (const e of spec.events) {
    if (!byStep.has(e.step)) byStep.set(e.step, []);
    byStep.get(e.step).push(e);
  }
  for (const e of spec.events) {
    const same = byStep.get(e.step);
    const x = sx(e.step) + (same.indexOf(e) - (same.length - 1) / 2) * 3;
    const lines = same.map((o) => eventLines(o).join('\n'));
    const g = svg('g', {class: 'adapt-marker', 'data-kind': e.kind, 'data-step': e.step});
    g.appendChild(svg('line', {x1: x, x2: x, y1: T, y2: H - B, stroke: kindColor(e.kind),
                               'stroke-width': 1.5, 'stroke-dasharray': '4 3'}));
    const hit = svg('line', {x1: x, x2: x, y1: T, y2: H - B, stroke: 'transparent',
                             'stroke-width': 9});
    hit.appendChild(svg('title', {}, lines.join('\n\n')));
    hit.addEventListener('mouseenter', (evt) => showTooltip(evt, lines));
    hit.addEventListener('mousemove', (evt) => showTooltip(evt, lines));
    hit.addEventListener('mouseleave', hideTooltip);
    g.appendChild(hit);
    root.appendChild(g);
  }

  card.textContent = '';
  card.appendChild(el('h3', {}, spec.title));
  const legend = el('div', {class: 'adapt-series-legend'});
  for (const s of spec.series) {
    const item = el('span');
    item.appendChild(el('span', {class: 'swatch', style: `background:${s.color}`}));
    item.appendChild(document.createTextNode(s.name));
    legend.appendChild(item);
  }
  card.appendChild(legend);
  card.appendChild(root);
}

// -- events table -------------------------------------------------------------

function renderTable(table, events, kind) {
  const tbody = table.tBodies[0];
  tbody.textContent = '';
  for (const e of events) {
    if (kind && e.kind !== kind) continue;
    const tr = el('tr', {'data-kind': e.kind});
    tr.appendChild(el('td', {}, e.step));
    tr.appendChild(el('td', {}, e.epoch));
    const kindCell = el('td', {class: 'adapt-kind'});
    kindCell.appendChild(el('span', {class: 'swatch', style: `background:${kindColor(e.kind)}`}));
    kindCell.appendChild(document.createTextNode(e.kind + (e.known === false ? ' (unknown)' : '')));
    tr.appendChild(kindCell);
    tr.appendChild(el('td', {}, e.policy));
    tr.appendChild(el('td', {}, e.reason));
    // Rounded for reading; the exact record is the cell's title (tooltip).
    tr.appendChild(el('td', {class: 'mono adapt-before', title: compact(e.before)},
                      formatValues(e.before)));
    tr.appendChild(el('td', {class: 'mono adapt-after', title: compact(e.after)},
                      formatValues(e.after)));
    tbody.appendChild(tr);
  }
}

// -- page ---------------------------------------------------------------------

function seriesOf(data, key, name, color, step = false) {
  return {name, color, step, points: data.series[TAG(key)] || []};
}

// A step chart of a series of choices (indices into `names`, from the
// server), or null when it would tell nothing: it needs points, and some
// choice other than `plain` in them or an event of `kind`. The same rule as
// keras_adapt.record.reader's shows_sync_strategy and shows_compression.
function choicesChart(data, events, {key, names, plain, kind, title, seriesName, color}) {
  const points = (data.series[TAG(key)] || []).filter((p) => Number.isFinite(p[2]));
  if (!points.length) return null;
  const base = names.indexOf(plain);
  if (!points.some((p) => p[2] !== base) && !events.some((e) => e.kind === kind)) return null;
  const name = (i) => (i >= 0 && i < names.length ? names[i] : `unknown (${i})`);
  const used = [...new Set(points.map((p) => Math.round(p[2])))].sort((a, b) => a - b);
  return {id: key, title, categories: used.map((i) => [i, name(i)]),
          series: [{name: seriesName, color, step: true, points}]};
}

// The "Sync strategy" chart (metadata.SYNC_STRATEGIES): a plain
// synchronous-SGD run gets none.
function syncStrategyChart(data, events, names) {
  return choicesChart(data, events, {key: 'sync_strategy', names, plain: 'allreduce_sgd',
                                     kind: 'sync_strategy', title: 'Sync strategy',
                                     seriesName: 'strategy in use', color: '#37474f'});
}

// The "Gradient compression" chart (metadata.COMPRESSIONS): a run that never
// sent float16 and recorded no communication event gets none.
function compressionChart(data, events, names) {
  return choicesChart(data, events, {key: 'compression', names, plain: 'none',
                                     kind: 'communication', title: 'Gradient compression',
                                     seriesName: 'gradients sent as', color: '#ad1457'});
}

async function showRun(run, ui) {
  hideTooltip();  // its marker is about to be replaced, with no mouseleave
  ui.status.textContent = 'loading…';
  ui.errors.textContent = '';
  let data, ev;
  try {
    const q = encodeURIComponent(run);
    [data, ev] = await Promise.all([
      getJson(`scalars?run=${q}&max_points=${MAX_POINTS}`),
      getJson(`events?run=${q}`),
    ]);
  } catch (err) {
    ui.status.textContent = '';
    ui.errors.textContent = `Could not load run ${run}: ${err.message}`;
    return;
  }
  if (ui.select.value !== run) return;  // the user picked another run meanwhile

  const events = ev.events || [];
  let x0 = Infinity, x1 = -Infinity;
  for (const pts of Object.values(data.series)) for (const p of pts) { x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]); }
  for (const e of events) { x0 = Math.min(x0, e.step); x1 = Math.max(x1, e.step); }
  if (!Number.isFinite(x0)) { x0 = 0; x1 = 1; }
  const common = {events, xDomain: [x0, x1]};

  const palette = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf'];
  const charts = [
    {id: 'noise', title: 'Noise scale (B_simple) and global batch size (log scale)', logY: true,
     series: [seriesOf(data, 'gns', 'noise scale', '#6a1b9a'),
              seriesOf(data, 'batch_size', 'global batch size', '#00897b', true)]},
    {id: 'lr', title: 'Learning rate', series: [seriesOf(data, 'lr', 'lr', '#ef6c00', true)]},
    {id: 'workers', title: 'Workers', integer: true,
     series: [seriesOf(data, 'workers', 'workers', '#2e7d32', true)]},
    {id: 'throughput', title: 'Throughput (samples/s)',
     series: [seriesOf(data, 'throughput', 'samples/s', '#1565c0')]},
  ];
  // A batch-size policy's counts: samples trained, and their statistical
  // progress in samples at the starting batch (they part once the batch
  // outgrows the noise scale; epochs may end on either, epoch_end).
  if (data.series[TAG('progress')]) {
    charts.push({id: 'progress', title: 'Training progress: samples trained and statistical progress',
                 series: [seriesOf(data, 'samples', 'samples', '#455a64'),
                          seriesOf(data, 'progress', 'progress', '#c2185b')]});
  }
  for (const [time, title] of WORKER_TIME_CHARTS) {
    const prefix = TAG(time) + '/rank_';
    const tags = Object.keys(data.series).filter((t) => t.startsWith(prefix)).sort(
      (a, b) => Number(a.slice(prefix.length)) - Number(b.slice(prefix.length)));
    if (!tags.length && time !== 'step_time') continue;  // no WorkerTimingMonitor in this run
    charts.push({id: time, title,
                 series: tags.map((t, i) => ({name: 'rank ' + t.slice(prefix.length),
                                              color: palette[i % palette.length], points: data.series[t]}))});
  }
  if (data.series[TAG('comm_fraction')]) {
    charts.push({id: 'comm_fraction', title: 'Worker timing: communication fraction',
                 series: [seriesOf(data, 'comm_fraction', 'comm_fraction', '#5d4037')]});
  }
  const sync = syncStrategyChart(data, events, ui.syncStrategies);
  if (sync) charts.push(sync);
  const compression = compressionChart(data, events, ui.compressions);
  if (compression) charts.push(compression);
  for (const [metric, title] of SYSTEM_CHARTS) {
    const tags = Object.keys(data.series)
      .filter((t) => t.startsWith(SYSTEM_PREFIX) && t.endsWith('/' + metric))
      .sort((a, b) => parseInt(a.slice(SYSTEM_PREFIX.length), 10) - parseInt(b.slice(SYSTEM_PREFIX.length), 10));
    if (!tags.length) continue;  // e.g. no GPU, or no SystemMonitor in this run
    charts.push({id: 'system_' + metric, title,
                 series: tags.map((t, i) => ({name: 'host ' + parseInt(t.slice(SYSTEM_PREFIX.length), 10),
                                              color: palette[i % palette.length], points: data.series[t]}))});
  }
  ui.charts.textContent = '';
  for (const spec of charts) {
    const card = el('div', {class: 'adapt-card', 'data-card': spec.id});
    ui.charts.appendChild(card);
    drawChart(card, {...common, ...spec});
  }

  // Kind filter: the kinds present in this run, plus "all".
  const current = ui.kind.value;
  ui.kind.textContent = '';
  ui.kind.appendChild(el('option', {value: ''}, `all kinds (${events.length})`));
  for (const k of ev.kinds || []) {
    const n = events.filter((e) => e.kind === k).length;
    ui.kind.appendChild(el('option', {value: k}, `${k} (${n})`));
  }
  ui.kind.value = (ev.kinds || []).includes(current) ? current : '';
  ui.events = events;
  renderTable(ui.table, events, ui.kind.value);

  ui.legend.textContent = '';
  for (const k of ev.kinds || []) {
    const item = el('span');
    item.appendChild(el('span', {class: 'swatch', style: `background:${kindColor(k)}`}));
    item.appendChild(document.createTextNode(k));
    ui.legend.appendChild(item);
  }
  const skipped = ev.skipped ? `, ${ev.skipped} unreadable record(s) skipped` : '';
  const newer = ev.newer
    ? `, ${ev.newer} record(s) of a newer keras-adapt not shown (upgrade keras-adapt where TensorBoard runs)`
    : '';
  ui.status.textContent = `${events.length} event(s)${skipped}${newer}`;
  document.body.setAttribute('data-adapt-ready', run);
}

export async function render() {
  document.head.appendChild(el('style', {}, STYLE));
  tooltip = el('div', {class: 'adapt-tooltip', id: 'adapt-tooltip'});

  const bar = el('div', {class: 'adapt-bar'});
  bar.appendChild(el('h2', {}, 'Adaptive training'));
  const runLabel = el('label', {}, 'Run ');
  const select = el('select', {id: 'adapt-run'});
  runLabel.appendChild(select);
  bar.appendChild(runLabel);
  const refresh = el('button', {id: 'adapt-refresh', type: 'button'}, 'Refresh');
  bar.appendChild(refresh);
  const status = el('span', {class: 'adapt-status', id: 'adapt-status'});
  bar.appendChild(status);

  const errors = el('div', {class: 'adapt-error', id: 'adapt-error'});
  const legend = el('div', {class: 'adapt-legend', id: 'adapt-legend'});
  const charts = el('div', {class: 'adapt-charts', id: 'adapt-charts'});

  const eventsHeader = el('div', {class: 'adapt-bar'});
  eventsHeader.appendChild(el('h2', {}, 'Adaptation events'));
  const kindLabel = el('label', {}, 'Kind ');
  const kind = el('select', {id: 'adapt-kind-filter'});
  kindLabel.appendChild(kind);
  eventsHeader.appendChild(kindLabel);

  const table = el('table', {class: 'adapt-events', id: 'adapt-events'});
  const head = el('tr');
  for (const h of ['step', 'epoch', 'kind', 'policy', 'reason', 'before', 'after']) head.appendChild(el('th', {}, h));
  table.appendChild(el('thead')).appendChild(head);
  table.appendChild(el('tbody'));

  for (const node of [bar, errors, legend, charts, eventsHeader, table, tooltip]) document.body.appendChild(node);
  const ui = {select, status, errors, legend, charts, kind, table, events: [], syncStrategies: [],
              compressions: []};

  kind.addEventListener('change', () => renderTable(table, ui.events, kind.value));
  select.addEventListener('change', () => showRun(select.value, ui));

  async function loadRuns() {
    let listing;
    try {
      listing = await getJson('runs');
    } catch (err) {
      errors.textContent = `Could not list runs: ${err.message}`;
      return;
    }
    ui.syncStrategies = listing.sync_strategies || [];
    ui.compressions = listing.compressions || [];
    kindColors = listing.kind_colors || {};
    unknownColor = listing.unknown_color || unknownColor;
    const previous = select.value;
    select.textContent = '';
    for (const r of listing.runs || []) select.appendChild(el('option', {value: r.run}, r.run));
    if (!(listing.runs || []).length) {
      status.textContent = 'No adapt data yet: train with keras_adapt.callbacks.AdaptTensorBoard(log_dir).';
      return;
    }
    const names = listing.runs.map((r) => r.run);
    select.value = names.includes(previous) ? previous : names[0];
    await showRun(select.value, ui);
  }
  refresh.addEventListener('click', loadRuns);
  await loadRuns();
}
