/**
 * The running cell's figures, from the kernel of the active notebook: the front end's side of
 * the status comm `nbbudget.status` (docs/lab.md). The kernel pushes a message when something
 * changes, at most once an interval; nothing here asks a kernel for anything while it is busy.
 */
import { ISessionContext } from '@jupyterlab/apputils';
import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

/** The whole state, as each message of the comm carries it. */
export interface IStatus {
  running: boolean;
  name: string | null;
  time_left_s: number | null;
  axis: string | null;
  fraction: number | null;
  label: string;
  jobs: number;
}

/** The comm's target in the kernel, registered by `%load_ext nbbudget`. */
export const TARGET = 'nbbudget.status';

/**
 * Follows one notebook at a time (the active one): opens the comm to its kernel, again after
 * the kernel restarts or changes, and again after a cell ran where nbbudget was not loaded
 * (the cell may have been `%load_ext nbbudget`). `status` is the last message, or null when
 * the kernel has no nbbudget (or no kernel is there).
 */
export class KernelStatus {
  constructor(private _intervalMs: number) {
    NotebookActions.executed.connect(this._onExecuted, this);
  }

  /** The last state the kernel sent; null when nbbudget is not loaded there. */
  get status(): IStatus | null {
    return this._status;
  }

  /** The id of the followed notebook's kernel, if it has one. */
  get kernelId(): string | null {
    return this._kernel?.id ?? null;
  }

  /** Emitted at each message, and when the kernel or nbbudget's presence changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Follow *panel*'s kernel (null: none). */
  follow(panel: NotebookPanel | null): void {
    if (panel === this._panel) {
      return;
    }
    if (this._panel) {
      this._panel.sessionContext.kernelChanged.disconnect(this._onKernel, this);
      this._panel.sessionContext.statusChanged.disconnect(this._onStatus, this);
    }
    this._panel = panel;
    if (panel) {
      panel.sessionContext.kernelChanged.connect(this._onKernel, this);
      panel.sessionContext.statusChanged.connect(this._onStatus, this);
    }
    this._connect(panel?.sessionContext.session?.kernel ?? null);
  }

  /** The interval asked of the kernel from the next comm on (the comm open now is closed and
   * opened again with it). */
  set intervalMs(value: number) {
    if (value !== this._intervalMs) {
      this._intervalMs = value;
      this._connect(this._kernel);
    }
  }

  /** Close the comm and stop following. */
  dispose(): void {
    NotebookActions.executed.disconnect(this._onExecuted, this);
    this.follow(null);
  }

  private _onKernel(): void {
    this._connect(this._panel?.sessionContext.session?.kernel ?? null);
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._drop();
    } else if (status === 'idle' && !this._comm && this._kernel && !this._absent) {
      this._open(); // after a restart: a kernel started with nbbudget loaded speaks again
    }
  }

  private _onExecuted(_: unknown, args: { notebook: unknown }): void {
    if (this._panel && args.notebook === this._panel.content && !this._comm) {
      this._open(); // the cell may have loaded nbbudget
    }
  }

  private _connect(kernel: Kernel.IKernelConnection | null): void {
    this._drop();
    this._kernel = kernel;
    this._absent = false;
    if (kernel) {
      this._open();
    }
    this._changed.emit();
  }

  private _open(): void {
    const kernel = this._kernel;
    if (!kernel || kernel.isDisposed) {
      return;
    }
    const comm = kernel.createComm(TARGET);
    let heard = false;
    comm.onMsg = msg => {
      if (comm !== this._comm) {
        return;
      }
      heard = true;
      this._status = msg.content.data as unknown as IStatus;
      this._changed.emit();
    };
    comm.onClose = msg => {
      if (comm !== this._comm) {
        return;
      }
      this._comm = null;
      const data = msg.content.data as { error?: string };
      if (data && data.error) {
        console.warn(`nbbudget: the kernel refused the status comm: ${data.error}`);
      }
      // closed without a word: nbbudget is not loaded in that kernel; a cell that ran since
      // opens it again (_onExecuted)
      this._absent = !heard;
      this._status = null;
      this._changed.emit();
    };
    this._comm = comm;
    try {
      comm.open({ interval_ms: this._intervalMs });
    } catch (error) {
      console.warn(`nbbudget: could not open the status comm: ${error}`);
      this._comm = null;
    }
  }

  private _drop(): void {
    const comm = this._comm;
    this._comm = null;
    this._status = null;
    if (comm && !comm.isDisposed) {
      try {
        comm.close();
      } catch {
        // the kernel is gone: nothing to tell it
      }
    }
  }

  private _panel: NotebookPanel | null = null;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _comm: Kernel.IComm | null = null;
  private _absent = false;
  private _status: IStatus | null = null;
  private _changed = new Signal<this, void>(this);
}
