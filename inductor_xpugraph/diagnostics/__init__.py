"""What the package says about itself and the machine: nothing here runs in a compiled call.

- ``doctor``: ``python -m inductor_xpugraph doctor``, one ``Finding`` per check of the stack
  (``findings``: the records, shared with the probe's report);
- ``device_probe``: captures and replays a small graph, and each operator of the device's
  do-not-capture list, through the project's backend, in a child process
  (``probe_exercises``: their inputs); ``probe_report`` starts it and turns what it printed
  into findings;
- ``report``: ``inductor_xpugraph.report()``, what the trees hold and why
  (``report_records``: the records and their text; ``report_picture``: the drawing);
- ``cpp_compiler``: the C++ compiler Inductor's CPU kernels, and so the CPU emulator, need
  (the doctor's line, and the command line's one-line error without one).

Arrows run one way: ``doctor`` -> ``probe_report`` -> ``device_probe``, ``findings``;
``doctor`` -> ``cpp_compiler``; ``report`` -> ``report_picture`` -> ``report_records``; all of
them read ``trees`` and ``codegen``, which never import this package.
"""
