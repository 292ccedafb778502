"""`python -m tests.child MODULE ARGS...` runs a test's child module as `python -m MODULE ARGS...`
would, without what a service skips at its start (`relay_runtime.start.hide_renderers`: structlog
would import `rich` and `pygments`, 0.18 s of CPU). Crash tests start their children hundreds of
times per run, and the children stand for services, which start the same way."""

from __future__ import annotations

import runpy
import sys

from relay_runtime.start import hide_renderers

if __name__ == "__main__":
    hide_renderers()
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
