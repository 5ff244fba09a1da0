"""The sandbox, the kernel's side of it: code that runs in a learner's kernel process.

``process`` is the kernel's entry point, ``confine`` applies the :class:`~autograder.protocol.Policy`
the grader wrote (namespaces, mounts, limits, another user), ``audit`` refuses what the
namespaces cannot (Python audit hooks), ``evidence`` prints what the instructor's probes
found. Nothing here imports the grader's side: only :mod:`autograder.protocol` and
:mod:`autograder.options` (tests/test_layering.py keeps it so).
"""
