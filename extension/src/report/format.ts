/** Number formatting for reports: units in the output, a dash for a missing value. */

export const MISSING = '—';

function isNumber(x: unknown): x is number {
  return typeof x === 'number' && Number.isFinite(x);
}

/** Three significant digits without exponent for ordinary magnitudes (12.3, 0.0456, 1234). */
export function formatNumber(x: unknown, digits = 3): string {
  if (!isNumber(x)) {
    return MISSING;
  }
  if (x === 0) {
    return '0';
  }
  const abs = Math.abs(x);
  if (abs >= 1e6 || abs < 1e-3) {
    return x.toExponential(digits - 1);
  }
  if (abs >= 10 ** digits) {
    return Math.round(x).toLocaleString('en-US');
  }
  return Number(x.toPrecision(digits)).toString();
}

/** An integer count with thousands separators. */
export function formatCount(x: unknown): string {
  return isNumber(x) ? Math.round(x).toLocaleString('en-US') : MISSING;
}

/** Bytes in B, KiB, MiB or GiB (binary units, as CUDA reports them). */
export function formatBytes(x: unknown): string {
  if (!isNumber(x)) {
    return MISSING;
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = x;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${Math.round(value)} B` : `${formatNumber(value)} ${units[unit]}`;
}

/** Bytes exactly, where the last byte matters (a block's shared memory): `1,032 B`, not `1.01 KiB`. */
export function formatExactBytes(x: unknown): string {
  return isNumber(x) ? `${formatCount(x)} B` : MISSING;
}

/** Milliseconds: `0.0123 ms`, `12.3 ms`, `1,234 ms`. */
export function formatMs(x: unknown): string {
  return isNumber(x) ? `${formatNumber(x)} ms` : MISSING;
}

/** A ratio in [0, 1] as a percentage: `62.5%`. */
export function formatPercent(x: unknown): string {
  return isNumber(x) ? `${Number((x * 100).toFixed(1))}%` : MISSING;
}

/** A speed-up factor: `3.41×`. */
export function formatSpeedup(x: unknown): string {
  return isNumber(x) ? `${formatNumber(x)}×` : MISSING;
}

/** A clamp to [0, 1] for bar widths. */
export function unitInterval(x: unknown): number {
  return isNumber(x) ? Math.min(1, Math.max(0, x)) : 0;
}
