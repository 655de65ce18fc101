/**
 * The kernel's GPU status: parsed from `application/vnd.kernellab.status+json` messages on the kernel's IOPub channel
 * (contract in README.md) and kept per notebook, so the status bar shows the current notebook's kernel.
 */

import { ISignal, Signal } from '@lumino/signaling';

import { STATUS_MIME } from '../tokens';
import { formatBytes } from '../report/format';

/** What kernellab.notebook.status publishes. */
export interface IGpuStatus {
  /** The device name (`NVIDIA H200`), or null without a GPU. */
  gpu: string | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  /** `gpu`: kernels run on the device; `simulator`: Numba's CUDA simulator; `compile-only`: no device at all. */
  mode: 'gpu' | 'simulator' | 'compile-only';
  /** Some cell's kernels run in the simulator (`%%numba --sim`), on a GPU machine too. */
  simulator: boolean;
}

/** How the status bar shows a status. */
export interface IStatusView {
  text: string;
  title: string;
  tone: 'gpu' | 'none';
}

const MODES = ['gpu', 'simulator', 'compile-only'];

function nullableNumber(x: unknown): number | null {
  return typeof x === 'number' && Number.isFinite(x) ? x : null;
}

/** Validate a status payload; null when it is not one. */
export function parseStatus(data: unknown): IGpuStatus | null {
  if (typeof data !== 'object' || data === null) {
    return null;
  }
  const d = data as Record<string, unknown>;
  const gpu = typeof d.gpu === 'string' && d.gpu ? d.gpu : null;
  const mode = typeof d.mode === 'string' && MODES.includes(d.mode) ? (d.mode as IGpuStatus['mode']) : gpu ? 'gpu' : 'compile-only';
  return {
    gpu,
    memory_used_bytes: nullableNumber(d.memory_used_bytes),
    memory_total_bytes: nullableNumber(d.memory_total_bytes),
    mode,
    simulator: d.simulator === true || mode === 'simulator'
  };
}

/** The status-bar text: `GPU: NVIDIA H200 · 1.2 GiB / 140 GiB` or `no GPU: compile-only`. */
export function describeStatus(status: IGpuStatus): IStatusView {
  if (status.gpu && status.mode === 'gpu') {
    const used = status.memory_used_bytes;
    const total = status.memory_total_bytes;
    const memory = used !== null ? ` · ${formatBytes(used)}${total !== null ? ` / ${formatBytes(total)}` : ''}` : '';
    return {
      text: `GPU: ${status.gpu}${memory}${status.simulator ? ' · + simulator' : ''}`,
      title:
        `kernellab: kernels run on ${status.gpu}${used !== null ? `; ${formatBytes(used)} of device memory in use` : ''}` +
        (status.simulator ? '. Kernels of %%numba --sim cells run in the CUDA simulator.' : ''),
      tone: 'gpu'
    };
  }
  const why =
    status.mode === 'simulator'
      ? 'Numba kernels run in the CUDA simulator; CUDA C++ cells compile only'
      : 'CUDA C++ and Numba cells compile (registers, shared memory, occupancy) but do not run';
  return { text: `no GPU: ${status.mode}`, title: `kernellab: the kernel sees no GPU. ${why}.`, tone: 'none' };
}

/** The minimal shape of a Jupyter message this module reads. */
export interface IMessageLike {
  header: { msg_type: string };
  content: unknown;
}

const DISPLAY_TYPES = ['display_data', 'update_display_data', 'execute_result'];

/** The status carried by an IOPub message, or null if it carries none. */
export function statusFromMessage(msg: IMessageLike): IGpuStatus | null {
  if (!DISPLAY_TYPES.includes(msg.header.msg_type)) {
    return null;
  }
  const data = (msg.content as { data?: Record<string, unknown> } | null)?.data;
  return data && STATUS_MIME in data ? parseStatus(data[STATUS_MIME]) : null;
}

/** Statuses by owner (a notebook panel), and which owner is current. */
export class GpuStatusModel {
  /** Emitted when the current owner's status changes or the current owner changes; read `current`. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The current owner's status, or null when its kernel has not reported one. */
  get current(): IGpuStatus | null {
    return this._owner ? this._statuses.get(this._owner) ?? null : null;
  }

  /** Record (or, with null, forget) an owner's status. */
  set(owner: object, status: IGpuStatus | null): void {
    if (status) {
      this._statuses.set(owner, status);
    } else {
      this._statuses.delete(owner);
    }
    if (owner === this._owner) {
      this._changed.emit();
    }
  }

  /** Make `owner` current (null: none). */
  setCurrent(owner: object | null): void {
    this._owner = owner;
    this._changed.emit();
  }

  private _owner: object | null = null;
  private readonly _statuses = new WeakMap<object, IGpuStatus>();
  private readonly _changed = new Signal<this, void>(this);
}
