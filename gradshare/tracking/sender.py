"""The sending process of an arm's outbox (`gradshare.tracking.outbox`), started by the arm's rank 0:

    python -m gradshare.tracking.sender <outbox>/<run id> <pid of the process that appends> <grace s>

Delivers the run's journal as it grows, several updates' metrics per request, while the
training process only appends to it: no request, no MLflow client and no store code runs in
the interpreter that launches the GPU's work. Ends on SIGTERM (the arm's `Outbox.close`), or
once the process that appends is gone (a rank killed: whoever holds the run next delivers),
after its current request. A real error of the store (not a lost server) is written to
`sender_error` beside the journal, where the arm's next grace check raises it.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from gradshare.tracking.connection import one_line
from gradshare.tracking.outbox import SENDER_ERROR, Outbox

POLL_S = 0.2
"""How often the journal is looked at: the delay between an update and its metrics' request."""


def main(argv=None) -> int:
    directory, parent, grace_s = (argv or sys.argv[1:])[:3]
    directory, parent = Path(directory), int(parent)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    box = Outbox(directory.name, grace_s=float(grace_s), directory=directory.parent)  # for its messages
    while not stop.is_set() and os.getppid() == parent:
        try:
            box.deliver()
        except Exception as exc:  # noqa: BLE001 - the store's own answer: the arm says it
            (directory / SENDER_ERROR).write_text(one_line(exc))
            return 1
        stop.wait(POLL_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
