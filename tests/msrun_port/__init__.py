"""A test-only port of MindSpore 2.10.0 msrun's process manager, for testing recoverd's ``MSRunPlugin``.

Installing MindSpore costs about 800 MB, so the tests drive the plugin with a faithful stand-in
instead: :class:`~tests.msrun_port.process_manager.ProcessManager` reproduces msrun's
``_ProcessManager`` (the four callbacks, worker spawning, the scheduler, the environment leaks and
the documented bugs), :mod:`tests.msrun_port.fake_msrun` reproduces msrun's entry point and the way
it finds and loads a TaskD plugin, and :mod:`tests.msrun_port.trivial_worker` is a worker script
that needs no MindSpore.

The behaviour follows ``/work/shared/reference/msrun-contract.md`` (sections 1-8); no MindSpore
code is copied. This package is test code: nothing under ``libs/`` or ``services/`` may import it.
"""

from __future__ import annotations

from pathlib import Path

TRIVIAL_WORKER = Path(__file__).resolve().with_name("trivial_worker.py")
"""Path of the trivial worker script (run it as ``python TRIVIAL_WORKER ...``)."""

__all__ = ["TRIVIAL_WORKER"]
