import { ICleanableModel, keepCleanOnKernelMetadata } from '../src/notebook/clean';

/** A notebook model as JupyterLab's shared model behaves: it emits the metadata change, then marks itself dirty. */
class FakeModel implements ICleanableModel {
  dirty = false;
  isDisposed = false;
  private slots: ((sender: unknown, change: { key: string }) => void)[] = [];
  readonly metadataChanged = {
    connect: (slot: (sender: unknown, change: { key: string }) => void): boolean => {
      this.slots.push(slot);
      return true;
    }
  };
  setMetadata(key: string): void {
    this.slots.forEach(slot => slot(this, { key }));
    this.dirty = true;
  }
}

const tick = () => new Promise(resolve => setTimeout(resolve, 0));

describe('an unmodified notebook whose kernel connects', () => {
  it('stays unmodified when only the kernel spec and language info change', async () => {
    const model = new FakeModel();
    keepCleanOnKernelMetadata(model);
    model.setMetadata('kernelspec');
    model.setMetadata('language_info');
    await tick();
    expect(model.dirty).toBe(false);
  });

  it('is modified by any other metadata', async () => {
    const model = new FakeModel();
    keepCleanOnKernelMetadata(model);
    model.setMetadata('widgets');
    await tick();
    expect(model.dirty).toBe(true);
  });

  it('stays modified when it already was', async () => {
    const model = new FakeModel();
    keepCleanOnKernelMetadata(model);
    model.dirty = true;
    model.setMetadata('language_info');
    await tick();
    expect(model.dirty).toBe(true);
  });
});
