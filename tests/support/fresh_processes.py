"""Fresh processes for tests, without paying torch's import in each.

A test that needs a process of its own (process-wide patches, a distributed rank) starts it
from a fork server: a process started once, which imports torch and Inductor and nothing
else, and forks a child per request. The child is as fresh as a new interpreter for
everything the tests touch (no compile has run, nothing is patched or enabled), and starts in
a fraction of a second instead of the 5-10 s an import of torch and Inductor takes on a CI
core. Tests that check a user's command line (the demo, the CLI, a deployed module loading
without the package) start real interpreters instead.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context

# What the server imports before it forks anything: torch, Inductor's compiler, and the
# distributed package; never this project, which a child enables (or not) itself.
PRELOADED = ["torch", "torch._inductor.compile_fx", "torch.distributed"]


def fork_server() -> multiprocessing.context.ForkServerContext:
    """The context whose processes are forked from the server (started on first use)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    return context
