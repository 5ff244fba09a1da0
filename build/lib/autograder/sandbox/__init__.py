"""The sandbox, the grader's side of it: what the grader runs to start and watch a kernel.

``spawn`` starts every process by naming its target (``forkserver`` forks them from a warm
interpreter), ``policy`` writes what a kernel may see and use, ``cgroups`` holds its
memory and processes, ``kernel_manager`` and ``processes`` start and stop it, ``device``
asks a fresh process whether there is a GPU and ``imports`` lists what a kernel imports
before it is confined. What runs inside the kernel is :mod:`autograder.kernel`; the two
share only :mod:`autograder.protocol`.
"""
