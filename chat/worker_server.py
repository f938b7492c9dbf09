"""Imported first by the server the UI workers are forked from (multiprocessing's forkserver, started
by chat/supervisor.py with `WORKER_IMPORTS`), and by nothing else: that server joins the app's
lifeline (chat/lifeline.py) before it spends seconds importing the rest.

Python runs no code of the app there but the modules it is told to import (it ignores `'__main__'`
among them on Python 3.11 and 3.12: cpython#126631, mended in later releases), so this module's
import is how that server leaves the app's process group (a Ctrl-C to the terminal then reaches
only the app's main process, which stops the workers in order) and watches the supervisor: once the
supervisor is gone (killed outright), the server ends, and the workers forked from it, which watch
it, end in turn. Each worker imports app.py (or tests/stand_in.py) as `__mp_main__` itself, as a
spawned process does, and so runs `app.spawned`.
"""

from __future__ import annotations

from chat import lifeline, logs

lifeline.leave_terminal_group()
lifeline.end_with_parent()
logs.configure_spawned()
