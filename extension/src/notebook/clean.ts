/**
 * An untouched notebook stays unmodified when its kernel connects. JupyterLab writes the kernel's spec and language
 * info into the notebook's metadata on connecting (`kernelspec.display_name` "Python 3 (ipykernel)" where the file
 * says "Python 3", `language_info.version` 3.11.7 where it was recorded under 3.12.3), which marks the notebook
 * modified, so closing an unread tutorial asked "Save your work?". Those two keys describe the reader's kernel, not
 * the notebook's content: a change to them alone leaves a clean notebook clean (a later save still writes them).
 */

/** The metadata a kernel's connection rewrites. */
export const KERNEL_METADATA: ReadonlySet<string> = new Set(['kernelspec', 'language_info']);

/** The part of a notebook model this needs (INotebookModel has it). */
export interface ICleanableModel {
  dirty: boolean;
  readonly isDisposed: boolean;
  readonly metadataChanged: {
    connect(slot: (sender: any, change: { key: string }) => void, thisArg?: unknown): boolean;
  };
}

/**
 * Keep `model` clean when only kernel metadata changes while it is clean. The shared model marks itself dirty just
 * after emitting the change, so the reset waits a microtask; a model already modified is left alone.
 */
export function keepCleanOnKernelMetadata(model: ICleanableModel): void {
  model.metadataChanged.connect((_, change) => {
    if (!KERNEL_METADATA.has(change.key) || model.dirty) {
      return;
    }
    void Promise.resolve().then(() => {
      if (!model.isDisposed) {
        model.dirty = false;
      }
    });
  });
}
