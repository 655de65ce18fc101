// jsdom has no DragEvent, which @lumino/dragdrop subclasses when it loads.
if (typeof globalThis.DragEvent === 'undefined') {
  globalThis.DragEvent = class DragEvent extends MouseEvent {};
}
