import { Signal } from '@lumino/signaling';

import { GpuStatusModel, describeStatus, parseStatus, statusFromMessage } from '../src/status/model';
import { watchSession } from '../src/status/listener';
import { GpuStatusItem, statusRendererFactory } from '../src/status/widget';
import { STATUS_MIME } from '../src/tokens';

const H200 = { gpu: 'NVIDIA H200', memory_used_bytes: 1.5 * 2 ** 30, memory_total_bytes: 140 * 2 ** 30, mode: 'gpu' };
const NONE = { gpu: null, memory_used_bytes: null, memory_total_bytes: null, mode: 'compile-only' };

function message(type: string, data: Record<string, unknown>) {
  return { header: { msg_type: type }, content: { data, metadata: {}, transient: { display_id: 'kernellab-status' } } };
}

describe('GPU status', () => {
  it('describes a GPU with its memory in use, and the lack of one', () => {
    expect(describeStatus(parseStatus(H200)!).text).toBe('GPU: NVIDIA H200 · 1.5 GiB / 140 GiB');
    expect(describeStatus(parseStatus(NONE)!).text).toBe('no GPU: compile-only');
    const sim = describeStatus(parseStatus({ ...NONE, mode: 'simulator' })!);
    expect(sim.text).toBe('no GPU: simulator');
    expect(sim.title).toContain('simulator');
  });

  it('says when cells run in the simulator, with or without a GPU', () => {
    // kernellab/notebook/status.py after a %%numba --sim cell: mode "simulator" without a GPU, a flag with one.
    const afterSim = describeStatus(parseStatus({ ...NONE, mode: 'simulator', simulator: true })!);
    expect(afterSim.text).toBe('no GPU: simulator');
    const gpuSim = describeStatus(parseStatus({ ...H200, simulator: true })!);
    expect(gpuSim.text).toBe('GPU: NVIDIA H200 · 1.5 GiB / 140 GiB · + simulator');
    expect(gpuSim.title).toContain('%%numba --sim');
    expect(parseStatus(H200)!.simulator).toBe(false);
  });

  it('validates payloads', () => {
    expect(parseStatus(null)).toBeNull();
    expect(parseStatus({ gpu: 'A100' })).toEqual({
      gpu: 'A100',
      memory_used_bytes: null,
      memory_total_bytes: null,
      mode: 'gpu',
      simulator: false
    });
    expect(parseStatus({ mode: 'warp-drive' })!.mode).toBe('compile-only');
  });

  it('reads display_data and update_display_data messages, nothing else', () => {
    expect(statusFromMessage(message('display_data', { [STATUS_MIME]: H200, 'text/plain': 'x' }))!.gpu).toBe('NVIDIA H200');
    expect(statusFromMessage(message('update_display_data', { [STATUS_MIME]: NONE }))!.mode).toBe('compile-only');
    expect(statusFromMessage(message('display_data', { 'text/plain': 'x' }))).toBeNull();
    expect(statusFromMessage({ header: { msg_type: 'status' }, content: { execution_state: 'idle' } })).toBeNull();
  });

  it("follows each notebook's kernel and shows the current one's", () => {
    const model = new GpuStatusModel();
    const item = new GpuStatusItem(model);
    const session = {
      iopubMessage: new Signal<any, any>({}),
      kernelChanged: new Signal<any, any>({}),
      statusChanged: new Signal<any, any>({})
    };
    const a = {};
    const b = {};
    watchSession(session as any, a, model);
    model.setCurrent(a);
    expect(item.node.textContent).toBe('');
    session.iopubMessage.emit(message('display_data', { [STATUS_MIME]: H200 }));
    expect(item.node.textContent).toBe('GPU: NVIDIA H200 · 1.5 GiB / 140 GiB');
    expect(item.node.dataset.tone).toBe('gpu');
    model.setCurrent(b);
    expect(model.current).toBeNull();
    expect(item.node.textContent).toBe('');
    model.setCurrent(a);
    session.statusChanged.emit('restarting');
    expect(model.current).toBeNull();
    session.iopubMessage.emit(message('update_display_data', { [STATUS_MIME]: NONE }));
    expect(item.node.textContent).toBe('no GPU: compile-only');
    // A %%numba --sim cell's update moves the bar off "compile-only".
    session.iopubMessage.emit(message('update_display_data', { [STATUS_MIME]: { ...NONE, mode: 'simulator', simulator: true } }));
    expect(item.node.textContent).toBe('no GPU: simulator');
    session.kernelChanged.emit({});
    expect(model.current).toBeNull();
  });

  it('renders status outputs as nothing', async () => {
    const widget = statusRendererFactory.createRenderer({ mimeType: STATUS_MIME } as any);
    await widget.renderModel({ data: { [STATUS_MIME]: H200 } } as any);
    expect(widget.node.childElementCount).toBe(0);
    expect(widget.node.classList).toContain('kl-StatusOutput');
  });
});
