"""How a click on a panel reaches it while its cell holds the kernel's main thread.

A click on a widget is a comm message on the kernel's shell channel. The main shell handles it
only once the cell running on the main thread has returned: for a ``%%budget`` cell, after the
run the click was meant to stop. A kernel with subshells (JEP 91, ipykernel 7) handles a message
addressed to a subshell on that subshell's own thread, at once:

- ipykernel 7.4 sends a front end's message on a comm to the subshell that last *published* on
  that comm, whatever subshell the front end addressed. A panel drawn by the cell, or by a
  thread it started, would have its clicks handled on the main shell, after the cell. So
  nbbudget makes a subshell of its own in the kernel, once, and sends each panel's widget
  messages as part of the cell's request addressed to that subshell: its clicks are handled on
  that subshell's thread, from any front end.
- ipykernel 7.1-7.3 send the message where the front end addressed it. JupyterLab 4.4 and later
  address widget messages to a subshell of their own (*comms over subshells*, on by default).
- ipykernel 6.29 has no subshells: the click waits for the cell, and the panel says so.

The subshell is made as the kernel's control thread makes one for a front end's
``create_subshell_request``, on that thread, without a request (so no status is published for
it); it is the kernel's, named ``subshell-<id>``, and lives as long as the kernel.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["OUTSIDE_A_KERNEL", "Clicks", "Route"]

#: how long a cell waits for the kernel to make the subshell (it takes about a millisecond)
_MAKE_WAIT_S = 2.0


@dataclass(frozen=True)
class Route:
    """Where one panel's clicks go. *parent* is the request its widget messages are sent as
    part of (None: the sending thread's own); *during_cell* whether a click reaches the panel
    while its cell holds the main thread."""

    parent: dict[str, Any] | None
    during_cell: bool


#: the route of a panel outside a kernel (a terminal, a test's shell): nothing holds its clicks
OUTSIDE_A_KERNEL = Route(None, during_cell=True)


class Clicks:
    """The route of the clicks on one kernel's panels; made once per shell by ``%load_ext``,
    asked by each ``%%budget`` cell (on the main thread) before its panel is built."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._lock = threading.Lock()
        self._subshell: str | None = None
        self._making = False

    def route(self) -> Route:
        """The route of the panel of the cell running now. Outside a kernel nothing holds a
        click; in a kernel without subshells it waits for the cell; in one with subshells the
        panel is addressed to nbbudget's subshell, made at the first cell that asks."""
        kernel = getattr(self.shell, "kernel", None)
        if kernel is None:
            return OUTSIDE_A_KERNEL
        if not _has_subshells(kernel):
            return Route(None, during_cell=False)
        subshell = self._subshell or self._make(kernel)
        parent = self.shell.get_parent()
        if subshell is None or not parent or "header" not in parent:
            return Route(None, during_cell=False)
        header = dict(parent["header"], subshell_id=subshell)
        return Route(dict(parent, header=header), during_cell=True)

    def _make(self, kernel: Any) -> str | None:
        """Make nbbudget's subshell on the kernel's control thread, as a front end's request
        would; its id, or None when this kernel cannot make one now (a later cell asks
        again). A subshell made after the wait is kept for the next cell."""
        try:
            pair = kernel.shell_channel_thread.manager.control_to_shell_channel
            control = kernel.control_thread.io_loop
        except AttributeError:  # a kernel whose subshells are made otherwise
            return None
        made = threading.Event()

        def make() -> None:  # on the control thread, the only one that uses its socket
            try:
                pair.from_socket.send_json({"type": "create"})
                reply = pair.from_socket.recv_json()
            except Exception:  # noqa: BLE001  (no subshell: the panels say a click waits)
                reply = {}
            with self._lock:
                if reply.get("status") == "ok":
                    self._subshell = str(reply["subshell_id"])
                self._making = False
            made.set()

        with self._lock:
            if self._making:
                return None
            self._making = True
        control.add_callback(make)
        made.wait(_MAKE_WAIT_S)
        return self._subshell


def _has_subshells(kernel: Any) -> bool:
    """Whether the kernel says it supports subshells (its ``kernel_info`` features)."""
    try:
        features = kernel.kernel_info.get("supported_features") or []
    except Exception:  # noqa: BLE001  (a kernel without the property: no subshells)
        return False
    return "kernel subshells" in features
