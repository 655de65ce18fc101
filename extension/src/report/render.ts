/**
 * kernellab reports as DOM: one designed panel per report kind (compile, occupancy, check, bench) and a plain
 * fallback for the others. Every string from the kernel goes in through textContent, never as HTML.
 */

import { ICellDiagnostic } from '../diagnostics/gutter';
import {
  MISSING,
  formatBytes,
  formatCount,
  formatExactBytes,
  formatMs,
  formatNumber,
  formatPercent,
  formatSpeedup,
  unitInterval
} from './format';

/** The common fields of every report (docs/DESIGN.md, "The report MIME type"). */
export interface IReport {
  kind: string;
  version: number;
  title?: string;
  [field: string]: unknown;
}

/** What the panel may ask of the page around it. */
export interface IRenderContext {
  /** Move the cell's editor to a diagnostic; when absent, diagnostics are shown without links. */
  revealDiagnostic?: (diagnostic: ICellDiagnostic) => void;
}

type Child = Node | string | null | undefined | false;

/** Create an element with classes and children (strings become text nodes). */
export function h(tag: string, className: string | null, ...children: Child[]): HTMLElement {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    node.append(typeof child === 'string' ? document.createTextNode(child) : child);
  }
  return node;
}

const KIND_LABEL: Record<string, string> = {
  compile: 'Compile',
  occupancy: 'Occupancy',
  check: 'Check',
  bench: 'Benchmark',
  profile: 'Profile',
  sanitize: 'Sanitizer',
  banks: 'Shared-memory banks'
};

const LIMITER_LABEL: Record<string, string> = {
  warps: 'warps per SM',
  registers: 'registers',
  shared: 'shared memory',
  shared_memory: 'shared memory',
  blocks: 'blocks per SM'
};

function num(x: unknown): number | null {
  return typeof x === 'number' && Number.isFinite(x) ? x : null;
}

function str(x: unknown): string | null {
  return typeof x === 'string' ? x : null;
}

function records(x: unknown): Record<string, unknown>[] {
  return Array.isArray(x) ? x.filter((r): r is Record<string, unknown> => typeof r === 'object' && r !== null) : [];
}

/** A small rounded label; `tone` picks the colour (good, bad, warn, or neutral). */
function chip(text: string, tone?: 'good' | 'bad' | 'warn', title?: string): HTMLElement {
  const node = h('span', `kl-Chip${tone ? ` kl-Chip--${tone}` : ''}`, text);
  if (title) {
    node.title = title;
  }
  return node;
}

/** A figure with its label above: `Registers / 32`. */
function stat(label: string, value: string, tone?: 'warn' | 'bad' | 'good', hint?: string): HTMLElement {
  const node = h(
    'div',
    `kl-Stat${tone ? ` kl-Stat--${tone}` : ''}`,
    h('div', 'kl-Stat-label', label),
    h('div', 'kl-Stat-value', value)
  );
  if (hint) {
    node.title = hint;
  }
  return node;
}

/** A horizontal meter filled to `ratio` of its width. */
function meter(ratio: unknown, label: string): HTMLElement {
  const fill = h('div', 'kl-Meter-fill');
  fill.style.width = `${(unitInterval(ratio) * 100).toFixed(1)}%`;
  const node = h('div', 'kl-Meter', fill);
  node.setAttribute('role', 'meter');
  node.setAttribute('aria-label', label);
  node.setAttribute('aria-valuemin', '0');
  node.setAttribute('aria-valuemax', '1');
  node.setAttribute('aria-valuenow', String(unitInterval(ratio)));
  return node;
}

function section(title: string, ...children: Child[]): HTMLElement {
  return h('div', 'kl-Section', h('div', 'kl-Section-title', title), ...children);
}

/** A table from a header row and body rows; cells may be nodes. */
function table(className: string, head: string[], rows: Child[][], numericFrom = 1): HTMLElement {
  const thead = h('thead', null, h('tr', null, ...head.map((t, i) => h('th', i >= numericFrom ? 'kl-num' : null, t))));
  const tbody = h(
    'tbody',
    null,
    ...rows.map(row => h('tr', null, ...row.map((c, i) => h('td', i >= numericFrom ? 'kl-num' : null, c))))
  );
  return h('table', `kl-Table ${className}`, thead, tbody);
}

/** The panel frame: kind label, title, chips on the right, body below. */
function frame(report: IReport, chips: Child[], ...body: Child[]): HTMLElement {
  const kind = KIND_LABEL[report.kind] ?? report.kind;
  const node = h(
    'section',
    `kl-Report kl-Report--${report.kind}`,
    h(
      'header',
      'kl-Report-header',
      h('span', 'kl-Report-kind', kind),
      h('span', 'kl-Report-title', str(report.title) ?? ''),
      h('span', 'kl-Report-chips', ...chips)
    ),
    h('div', 'kl-Report-body', ...body)
  );
  node.dataset.kind = report.kind;
  return node;
}

/** Why the card shows occupancy at its block size (kernellab.Kernel.card_block_size). */
const BLOCK_SOURCE: Record<string, string> = {
  'launch bounds': 'its __launch_bounds__',
  'best block': 'its best block size',
  default: 'default',
  requested: 'as asked'
};

/** The occupancy meter with its numbers and limiter. */
function occupancyBlock(occ: Record<string, unknown>): HTMLElement {
  const ratio = num(occ.ratio);
  const limiter = str(occ.limiter);
  const blockSize = num(occ.block_size);
  const source = str(occ.block_source);
  return h(
    'div',
    'kl-Occupancy',
    h(
      'div',
      'kl-Occupancy-head',
      h('span', 'kl-Occupancy-label', 'Occupancy'),
      h('span', 'kl-Occupancy-value', formatPercent(ratio)),
      blockSize !== null
        ? h('span', 'kl-Occupancy-at', `at ${formatCount(blockSize)} threads/block${source ? ` (${BLOCK_SOURCE[source] ?? source})` : ''}`)
        : null
    ),
    meter(ratio, 'occupancy'),
    h(
      'div',
      'kl-Occupancy-detail',
      num(occ.blocks_per_sm) !== null ? `${formatCount(occ.blocks_per_sm)} blocks/SM` : null,
      num(occ.warps_per_sm) !== null ? ` · ${formatCount(occ.warps_per_sm)} warps/SM` : null,
      limiter
        ? h('span', 'kl-Occupancy-limiter', ' · limited by ', h('span', 'kl-Limiter', LIMITER_LABEL[limiter] ?? limiter))
        : null
    )
  );
}

function bestBlockSizes(x: unknown): HTMLElement | null {
  if (!Array.isArray(x) || x.length === 0) {
    return null;
  }
  const chips = x.map(entry => {
    if (typeof entry === 'number') {
      return chip(formatCount(entry));
    }
    if (typeof entry === 'object' && entry !== null) {
      const e = entry as Record<string, unknown>;
      const size = num(e.block_size);
      const ratio = num(e.ratio ?? e.occupancy);
      return chip(
        `${formatCount(size)}${ratio !== null ? ` · ${formatPercent(ratio)}` : ''}`,
        undefined,
        ratio !== null ? `${formatCount(size)} threads/block gives ${formatPercent(ratio)} occupancy` : undefined
      );
    }
    return chip(String(entry));
  });
  return h('div', 'kl-BestBlocks', h('span', 'kl-BestBlocks-label', 'Best block sizes'), ...chips);
}

/** One kernel's resource card: what ptxas reported and what that allows. */
function kernelCard(k: Record<string, unknown>): HTMLElement {
  const spillStore = num(k.spill_store_bytes) ?? 0;
  const spillLoad = num(k.spill_load_bytes) ?? 0;
  const local = num(k.local_bytes) ?? 0;
  const spills = spillStore + spillLoad > 0;
  const occ = typeof k.occupancy === 'object' && k.occupancy !== null ? (k.occupancy as Record<string, unknown>) : null;
  return h(
    'div',
    'kl-Kernel',
    h(
      'div',
      'kl-Kernel-head',
      h('span', 'kl-Kernel-name', str(k.name) ?? '(kernel)'),
      str(k.signature) ? h('code', 'kl-Kernel-signature', str(k.signature)) : null
    ),
    h(
      'div',
      'kl-Stats',
      stat('Registers', formatCount(k.registers), undefined, 'registers per thread'),
      stat(
        'Shared',
        formatExactBytes(k.shared_bytes),
        undefined,
        'static shared memory the block declares (as ptxas reports it); the block is allocated this rounded up to ' +
          "the allocation unit, plus the system's reservation (see the occupancy explorer's reasons)"
      ),
      stat('Local', formatBytes(k.local_bytes), local > 0 ? 'warn' : undefined, 'local memory (stack) per thread'),
      stat(
        'Spills',
        spills ? `${formatBytes(spillStore)} st / ${formatBytes(spillLoad)} ld` : 'none',
        spills ? 'bad' : 'good',
        'register spill stores and loads per thread'
      ),
      stat('Max threads', formatCount(k.max_threads_per_block), undefined, 'max threads per block for this kernel')
    ),
    occ ? occupancyBlock(occ) : null,
    bestBlockSizes(k.best_block_sizes),
    instructionsBlock(k.instructions)
  );
}

/** The kernel's SASS counted by kind (static: in the code, not executed): which path the compiler took. */
function instructionsBlock(x: unknown): HTMLElement | null {
  if (typeof x !== 'object' || x === null) {
    return null;
  }
  const summary = x as Record<string, unknown>;
  const lines = (Array.isArray(summary.lines) ? summary.lines : []).filter(
    (l): l is [string, string] => Array.isArray(l) && l.length === 2 && l.every(v => typeof v === 'string')
  );
  if (lines.length === 0) {
    return null;
  }
  const rows = lines.map(([group, counts]) => {
    const tone = group === 'local memory' && counts !== 'none' ? 'warn' : group === 'tensor cores' ? 'good' : null;
    return [h('span', tone ? `kl-Instr-group kl-Instr--${tone}` : 'kl-Instr-group', group), h('code', null, counts)];
  });
  const total = num(summary.total);
  const headline = str(summary.headline);
  const title = h('summary', null, h('span', 'kl-Instructions-label', 'SASS'), headline ? ` ${headline}` : '');
  title.title = `${total !== null ? `${formatCount(total)} instructions; ` : ''}counted in the code, not as executed`;
  return h('details', 'kl-Instructions', title, table('kl-Instructions-table', ['kind', 'count'], rows, 2));
}

/** Compiler messages from a report, with defaults for missing fields (line 1, severity error). */
export function parseDiagnostics(x: unknown): ICellDiagnostic[] {
  return records(x).map(d => ({
    line: num(d.line) ?? 1,
    column: num(d.column) ?? undefined,
    severity: d.severity === 'warning' ? ('warning' as const) : ('error' as const),
    message: str(d.message) ?? ''
  }));
}

function diagnosticsBlock(x: unknown, context: IRenderContext): HTMLElement | null {
  const diagnostics = parseDiagnostics(x);
  if (diagnostics.length === 0) {
    return null;
  }
  const items = diagnostics.map(d => {
    const where = `line ${d.line}${d.column ? `:${d.column}` : ''}`;
    const row = h(
      context.revealDiagnostic ? 'button' : 'div',
      `kl-Diag kl-Diag--${d.severity}`,
      h('span', 'kl-Diag-icon', d.severity === 'error' ? '●' : '▲'),
      h('span', 'kl-Diag-severity', d.severity),
      h('span', 'kl-Diag-where', where),
      h('span', 'kl-Diag-message', d.message)
    );
    row.dataset.line = String(d.line);
    if (context.revealDiagnostic) {
      const reveal = context.revealDiagnostic;
      row.setAttribute('type', 'button');
      row.title = `Go to ${where} in the cell`;
      row.addEventListener('click', () => reveal(d));
    }
    return h('li', null, row);
  });
  const errors = diagnostics.filter(d => d.severity === 'error').length;
  const warnings = diagnostics.length - errors;
  const summary = [errors ? `${errors} error${errors > 1 ? 's' : ''}` : '', warnings ? `${warnings} warning${warnings > 1 ? 's' : ''}` : '']
    .filter(Boolean)
    .join(', ');
  return section(`Diagnostics: ${summary}`, h('ul', 'kl-Diagnostics', ...items));
}

function notesBlock(x: unknown): HTMLElement | null {
  const notes = Array.isArray(x) ? x.filter((n): n is string => typeof n === 'string') : [];
  return notes.length ? section('Notes', h('ul', 'kl-Notes', ...notes.map(n => h('li', null, n)))) : null;
}

/**
 * The cache and the time this cell took: a hit shows its own (lookup) time, with the original compile time on hover;
 * a miss shows the compile time.
 */
export function timingChips(report: IReport): HTMLElement[] {
  const cache = str(report.cache);
  const compileMs = num(report.compile_ms);
  const wallMs = num(report.wall_ms);
  if (cache === 'hit') {
    const from = str(report.cache_source);
    const title = `served from the ${from ? `${from} ` : ''}compile cache${
      compileMs !== null ? `; compiling it took ${formatMs(compileMs)}` : ''
    }`;
    return [chip(wallMs !== null ? `cache hit · ${formatMs(wallMs)}` : 'cache hit', 'good', title)];
  }
  const chips: HTMLElement[] = [];
  if (cache) {
    chips.push(chip(`cache ${cache}`, undefined, 'compile cache'));
  }
  if (compileMs !== null) {
    chips.push(chip(formatMs(compileMs), undefined, 'compile time'));
  }
  return chips;
}

function renderCompile(report: IReport, context: IRenderContext): HTMLElement {
  const kernels = records(report.kernels);
  const diagnostics = records(report.diagnostics);
  const failed = report.ok === false || diagnostics.some(d => d.severity !== 'warning');
  const log = str(report.log);
  const chips: Child[] = [
    failed ? chip('failed', 'bad') : null,
    str(report.arch) ? chip(str(report.arch)!, undefined, 'target architecture') : null,
    ...timingChips(report)
  ];
  const node = frame(
    report,
    chips,
    diagnosticsBlock(report.diagnostics, context),
    ...kernels.map(kernelCard),
    notesBlock(report.notes),
    failed && log ? h('details', 'kl-Log', h('summary', null, 'Compiler log'), h('pre', null, log)) : null
  );
  if (failed) {
    // The cell also raises (so that Run All stops); style/base.css hides that repeat of this panel.
    node.dataset.failed = 'true';
  }
  return node;
}

/** Blocks per SM that each resource allows: `limits` {warps, registers, shared_memory, blocks} or `blocks_limit_*`. */
function occupancyLimits(report: IReport): { key: string; blocks: number | null; reason: string | null }[] {
  const limits = typeof report.limits === 'object' && report.limits !== null ? (report.limits as Record<string, unknown>) : null;
  const reasons = typeof report.reasons === 'object' && report.reasons !== null ? (report.reasons as Record<string, unknown>) : {};
  if (limits) {
    return Object.keys(limits).map(key => ({ key, blocks: num(limits[key]), reason: str(reasons[key]) }));
  }
  return ['warps', 'registers', 'shared', 'blocks']
    .filter(key => `blocks_limit_${key}` in report)
    .map(key => ({ key, blocks: num(report[`blocks_limit_${key}`]), reason: null }));
}

function limiterLabel(key: string | null): string {
  if (!key) {
    return MISSING;
  }
  return LIMITER_LABEL[key] ?? key.replace(/_/g, ' ');
}

function renderOccupancy(report: IReport): HTMLElement {
  const limiter = str(report.limiter);
  const limiters = Array.isArray(report.limiters) ? report.limiters.filter((l): l is string => typeof l === 'string') : [];
  const isLimiter = (key: string) => key === limiter || limiters.includes(key);
  const limits = occupancyLimits(report);
  const finite = limits.map(l => l.blocks).filter((v): v is number => v !== null);
  const widest = finite.length ? Math.max(...finite) : 1;
  const rows = limits.map(l => {
    const name = h('span', 'kl-Limit-name', limiterLabel(l.key), isLimiter(l.key) ? h('span', 'kl-Limiter kl-Limiter--tag', 'limiter') : null);
    const bar = h('div', 'kl-Limit-bar', meter(l.blocks === null ? 1 : l.blocks / widest, `blocks per SM allowed by ${l.key}`));
    const reason = l.reason ? h('div', 'kl-Limit-reason', l.reason) : null;
    return [h('div', null, name, reason), bar, l.blocks === null ? 'no limit' : formatCount(l.blocks)];
  });
  const limitsTable = rows.length ? table('kl-Limits', ['Blocks per SM allowed by', '', 'blocks'], rows, 2) : null;
  limitsTable?.querySelectorAll('tbody tr').forEach((tr, i) => {
    if (isLimiter(limits[i].key)) {
      tr.classList.add('kl-is-limiter');
    }
  });
  const chips: Child[] = [
    str(report.arch) ? chip(str(report.arch)!, undefined, 'target architecture') : null,
    limiter ? chip(`limited by ${limiterLabel(limiter)}`, 'warn') : null
  ];
  const maxWarps = num(report.max_warps_per_sm);
  return frame(
    report,
    chips,
    occupancyBlock(report),
    h(
      'div',
      'kl-Stats',
      stat('Block size', formatCount(report.block_size), undefined, 'threads per block'),
      stat('Registers', formatCount(report.registers), undefined, 'registers per thread'),
      stat('Shared', formatBytes(report.shared_bytes), undefined, 'shared memory per block, as requested'),
      stat('Blocks/SM', formatCount(report.blocks_per_sm), undefined, 'resident blocks per SM'),
      stat(
        'Warps/SM',
        maxWarps !== null ? `${formatCount(report.warps_per_sm)} / ${formatCount(maxWarps)}` : formatCount(report.warps_per_sm),
        undefined,
        'resident warps per SM, of the most the SM holds'
      )
    ),
    limitsTable
  );
}

/** The worst elements as [index, yours, reference, error / tolerance]: `worst_values`, or `worst` as objects. */
function worstElements(report: IReport): [string, unknown, unknown, number | null][] {
  const index = (i: unknown) => (Array.isArray(i) ? `[${i.join(', ')}]` : String(i ?? MISSING));
  if (Array.isArray(report.worst_values)) {
    return report.worst_values
      .filter((w): w is unknown[] => Array.isArray(w))
      .map(w => [index(w[0]), w[1], w[2], num(w[3])]);
  }
  return records(report.worst).map(w => [index(w.index), w.actual, w.expected, null]);
}

/** A JSON number that may be spelled "inf" / "nan" (non-finite values). */
function formatValue(x: unknown, digits = 6): string {
  return typeof x === 'string' ? x : formatNumber(x, digits);
}

function renderCheck(report: IReport): HTMLElement {
  const passed = report.passed === true;
  const mismatches = num(report.mismatches) ?? 0;
  const trials = num(report.trials);
  const shape = Array.isArray(report.shape) ? `(${report.shape.join(', ')})` : null;
  const chips: Child[] = [
    chip(passed ? 'passed' : 'failed', passed ? 'good' : 'bad'),
    trials !== null ? chip(`${formatCount(trials)} trial${trials === 1 ? '' : 's'}`) : null,
    str(report.dtype) ? chip(`${report.dtype}${shape ? ` ${shape}` : ''}`, undefined, 'output dtype and shape') : null
  ];
  const verdict = h(
    'div',
    `kl-Verdict kl-Verdict--${passed ? 'pass' : 'fail'}`,
    h('span', 'kl-Verdict-icon', passed ? '✓' : '✗'),
    h('span', 'kl-Verdict-text', str(report.message) ?? (passed ? 'matches the reference' : 'differs from the reference'))
  );
  // Show the elements that matter: those out of tolerance when it failed, else the few largest errors.
  let worst = worstElements(report);
  if (!passed && worst.some(w => w[3] !== null && w[3] > 1)) {
    worst = worst.filter(w => w[3] === null || w[3] > 1);
  }
  worst = worst.slice(0, passed ? 3 : 8);
  const hasRatio = worst.some(w => w[3] !== null);
  const worstRows = worst.map(([index, yours, ref, ratio]) => {
    const a = num(yours);
    const e = num(ref);
    const row: Child[] = [
      h('code', null, index),
      formatValue(yours),
      formatValue(ref),
      a !== null && e !== null ? formatNumber(Math.abs(a - e)) : MISSING
    ];
    if (hasRatio) {
      row.push(h('span', ratio !== null && ratio > 1 ? 'kl-Bad' : null, ratio === null ? MISSING : `${formatNumber(ratio)}×`));
    }
    return row;
  });
  const head = ['index', 'yours', 'reference', '|difference|', ...(hasRatio ? ['error / tolerance'] : [])];
  const worstTable = worstRows.length
    ? section(passed ? 'Largest differences' : 'Worst elements', table('kl-Worst', head, worstRows))
    : null;
  const extra = [str(report.tolerance), str(report.exception), str(report.reproduce) ? `reproduce: ${report.reproduce}` : null]
    .filter((x): x is string => Boolean(x));
  // Why the reference is not in float64 (out of memory, an op without float64): said, not silently fallen back from.
  const referenceNote = str(report.reference_note);
  return frame(
    report,
    chips,
    verdict,
    h(
      'div',
      'kl-Stats',
      stat('Mismatches', formatCount(mismatches), mismatches > 0 ? 'bad' : 'good', 'elements outside atol + rtol·|reference|'),
      stat('Max abs error', formatValue(report.max_abs_error, 3)),
      stat('Max rel error', formatValue(report.max_rel_error, 3)),
      stat('atol', formatValue(report.atol, 3)),
      stat('rtol', formatValue(report.rtol, 3))
    ),
    referenceNote ? h('div', 'kl-Note kl-Note--warn', `note: ${referenceNote}`) : null,
    worstTable,
    extra.length ? h('div', 'kl-Report-footer', ...extra.map(t => h('div', null, t))) : null
  );
}

/** One timed function: a name, its median and spread, and its rates. */
interface IBenchRow {
  name: string;
  median: number | null;
  low: number | null;
  high: number | null;
  tflops: number | null;
  gbps: number | null;
}

/** The bench rows: the function and its baselines (kernellab's BenchResult), or the `rows` of the brief's shape. */
function benchRows(report: IReport): { rows: IBenchRow[]; spread: string } {
  if (Array.isArray(report.rows)) {
    return {
      spread: 'q20 – q80',
      rows: records(report.rows).map(r => ({
        name: str(r.name) ?? MISSING,
        median: num(r.median_ms),
        low: num(r.q20_ms),
        high: num(r.q80_ms),
        tflops: num(r.tflops),
        gbps: num(r.gbps)
      }))
    };
  }
  const one = (r: Record<string, unknown>): IBenchRow => {
    const q = typeof r.quantiles_ms === 'object' && r.quantiles_ms !== null ? (r.quantiles_ms as Record<string, unknown>) : {};
    return {
      name: str(r.name) ?? MISSING,
      median: num(r.median_ms),
      low: num(q['0.25']) ?? num(q['0.2']),
      high: num(q['0.75']) ?? num(q['0.8']),
      tflops: num(r.tflops),
      gbps: num(r.gbps)
    };
  };
  return { spread: 'q25 – q75', rows: [one(report), ...records(report.baselines).map(one)] };
}

function benchTable(rows: IBenchRow[], spread: string, speedups: Map<string, string>): HTMLElement {
  const medians = rows.map(r => r.median).filter((v): v is number => v !== null);
  const slowest = medians.length ? Math.max(...medians) : 1;
  const fastest = medians.length ? Math.min(...medians) : null;
  const columns: [string, (r: IBenchRow) => string][] = [];
  if (rows.some(r => r.tflops !== null)) {
    columns.push(['TFLOP/s', r => formatNumber(r.tflops)]);
  }
  if (rows.some(r => r.gbps !== null)) {
    columns.push(['GB/s', r => formatNumber(r.gbps)]);
  }
  if (speedups.size) {
    columns.push(['speed-up', r => speedups.get(r.name) ?? '']);
  }
  const body = rows.map(r => {
    const bar = h(
      'div',
      `kl-Bench-median${r.median !== null && r.median === fastest ? ' kl-is-fastest' : ''}`,
      meter(r.median !== null && slowest > 0 ? r.median / slowest : 0, 'median time relative to the slowest'),
      h('span', 'kl-Bench-ms', formatMs(r.median))
    );
    return [
      h('span', 'kl-Bench-name', r.name),
      bar,
      r.low !== null || r.high !== null ? `${formatNumber(r.low)} – ${formatNumber(r.high)}` : MISSING,
      ...columns.map(([, f]) => f(r))
    ];
  });
  return table('kl-Bench', ['', 'median', `${spread} ms`, ...columns.map(c => c[0])], body);
}

function renderSweep(report: IReport, sweep: Record<string, unknown>): HTMLElement {
  const xName = str(sweep.x_name) ?? 'x';
  const xs = Array.isArray(sweep.xs) ? sweep.xs : [];
  const points = records(sweep.points);
  const names = points.length ? benchRows(points[0] as IReport).rows.map(r => r.name) : [];
  const body = points.map((p, i) => {
    const rows = benchRows(p as IReport).rows;
    return [h('code', null, String(xs[i] ?? i)), ...names.map(n => formatMs(rows.find(r => r.name === n)?.median))];
  });
  const first = points[0] ?? {};
  const footer = [str(first.device), str(first.method)].filter(Boolean).join(' · ');
  return frame(
    report,
    [str(first.device) ? chip(str(first.device)!) : null, chip(`${points.length} points`)],
    section('Median time', table('kl-Bench kl-Sweep', [xName, ...names], body)),
    footer ? h('div', 'kl-Report-footer', footer) : null
  );
}

function renderBench(report: IReport): HTMLElement {
  if (typeof report.sweep === 'object' && report.sweep !== null) {
    return renderSweep(report, report.sweep as Record<string, unknown>);
  }
  const { rows, spread } = benchRows(report);
  // Speed-ups: per row (brief shape), or of the function over each named baseline (kernellab's shape).
  const speedups = new Map<string, string>();
  for (const r of records(report.rows)) {
    if (num(r.speedup) !== null) {
      speedups.set(str(r.name) ?? MISSING, formatSpeedup(r.speedup));
    }
  }
  const speedupChips = records(report.speedups).map(s => {
    const ratio = num(s.ratio);
    const low = num(s.low);
    const high = num(s.high);
    const range = low !== null && high !== null ? ` (${formatNumber(low)} – ${formatNumber(high)})` : '';
    return chip(
      `${formatSpeedup(ratio)} vs ${str(s.baseline) ?? '?'}${range}`,
      ratio === null ? undefined : ratio >= 1 ? 'good' : 'bad',
      `${str(report.name) ?? 'fn'} is ${formatSpeedup(ratio)} as fast as ${str(s.baseline)}; range over ${formatCount(s.rounds)} rounds`
    );
  });
  const footer = [str(report.device), str(report.method)].filter(Boolean).join(' · ');
  return frame(
    report,
    [str(report.device) ? chip(str(report.device)!, undefined, 'device') : null],
    benchTable(rows, spread, speedups),
    speedupChips.length ? h('div', 'kl-Speedups', h('span', 'kl-BestBlocks-label', 'Speed-up'), ...speedupChips) : null,
    footer ? h('div', 'kl-Report-footer', footer) : null
  );
}

/**
 * A scalar field's text: an integer in full, as it can be typed back (a seed of 125000000, not 1.25e+8), other
 * numbers to three digits, and a dash for an empty string (an empty value would leave its row without text).
 */
export function fieldValue(v: unknown): string {
  if (typeof v === 'number') {
    return Number.isSafeInteger(v) ? String(v) : formatNumber(v);
  }
  return v === '' ? MISSING : String(v);
}

/** Any other kind: its scalar fields as a definition list, arrays of records as tables. */
function renderGeneric(report: IReport): HTMLElement {
  const skip = new Set(['kind', 'version', 'title']);
  const scalars = Object.entries(report).filter(
    ([k, v]) => !skip.has(k) && (typeof v === 'number' || typeof v === 'string' || typeof v === 'boolean')
  );
  const tables = Object.entries(report)
    .filter(([k, v]) => !skip.has(k) && records(v).length > 0)
    .map(([k, v]) => {
      const rows = records(v);
      const keys = [...new Set(rows.flatMap(r => Object.keys(r)))];
      return section(
        k,
        table(
          'kl-Generic',
          keys,
          rows.map(r => keys.map(key => (typeof r[key] === 'number' ? formatNumber(r[key]) : String(r[key] ?? MISSING)))),
          keys.length
        )
      );
    });
  const list = h('dl', 'kl-Fields', ...scalars.flatMap(([k, v]) => [h('dt', null, k), h('dd', null, fieldValue(v))]));
  return frame(report, [], scalars.length ? list : null, ...tables);
}

/** Whether `data` looks like a kernellab report. */
export function isReport(data: unknown): data is IReport {
  return typeof data === 'object' && data !== null && typeof (data as IReport).kind === 'string';
}

/** Render one report as a panel. */
export function renderReport(report: IReport, context: IRenderContext = {}): HTMLElement {
  switch (report.kind) {
    case 'compile':
      return renderCompile(report, context);
    case 'occupancy':
      return renderOccupancy(report);
    case 'check':
      return renderCheck(report);
    case 'bench':
      return renderBench(report);
    default:
      return renderGeneric(report);
  }
}

/** The diagnostics of a compile report, in the shape the editor gutter takes. */
export function reportDiagnostics(report: IReport): ICellDiagnostic[] {
  return report.kind === 'compile' ? parseDiagnostics(report.diagnostics) : [];
}
