"""Similarity of hand-ins (``python -m autograder similarity`` and the instructor's page
``/instructor/similarity/ASSIGNMENT``): which learners handed in the most alike answers.

The learners' notebooks are the course's real release of ``ring_allreduce``
(``exercises/ring_allreduce/``) with answers typed in: ada's, bob's (ada's, copied: names
changed, the functions in another order, comments added), two written independently (cy's and
dee's), gus's (cy's, but
ada's last function copied), and two that hold nothing but the given code (eve's, untouched; fay's, with a cell of the
given code pasted in). bob's copy carries a ``<script>``, which must show as text. The command
runs as an instructor types it, over nbgrader's ``submitted/`` folder; the page is the real
service's (its application over HTTP, its database and sign-in; no graders), where learners
hand in with ``POST /submit`` as ``submit`` does.
"""
from __future__ import annotations

import asyncio
import copy
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from autograder.commands.submit import multipart
from coursebook.service_process import tool_env

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = "ring_allreduce"
RELEASE = ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
SCRIPT = "<script>alert('copied')</script>"

ADA = '''\
def reduce_scatter(chunks, network):
    """n - 1 steps; afterwards chunks[i][(i + 1) % n] holds the sum of that chunk over all workers."""
    n = len(chunks)
    for step in range(n - 1):
        for sender in range(n):
            receiver = (sender + 1) % n
            piece = (sender - step) % n
            incoming = network.send(sender, receiver, chunks[sender][piece])
            chunks[receiver][piece].add_(incoming)


def all_gather(chunks, network):
    """n - 1 steps; afterwards every worker holds every complete chunk."""
    n = len(chunks)
    for step in range(n - 1):
        for sender in range(n):
            receiver = (sender + 1) % n
            piece = (sender + 1 - step) % n
            incoming = network.send(sender, receiver, chunks[sender][piece])
            chunks[receiver][piece].copy_(incoming)


def ring_allreduce(data, network=None):
    """Leave the sum of the tensors in `data` in every one of them, in place, over a ring."""
    if not data:
        raise ValueError("there is nothing to reduce: the list of tensors is empty")
    workers = len(data)
    if network is None:
        network = RingNetwork([tensor.device for tensor in data])
    with torch.no_grad():
        chunks = [tensor.view(-1).tensor_split(workers) for tensor in data]
        reduce_scatter(chunks, network)
        all_gather(chunks, network)
'''

# ada's, with every name of hers changed, the functions in reverse order and comments added
BOB = f'''\
def ring_allreduce(data, network=None):
    """Leave the sum of the tensors in `data` in every one of them, in place, over a ring."""
    # first check the input
    if not data:
        raise ValueError("there is nothing to reduce: the list of tensors is empty")
    size = len(data)
    if network is None:
        network = RingNetwork([t.device for t in data])
    with torch.no_grad():
        parts = [t.view(-1).tensor_split(size) for t in data]
        reduce_scatter(parts, network)
        all_gather(parts, network)


def all_gather(chunks, network):
    """n - 1 steps; afterwards every worker holds every complete chunk."""
    n = len(chunks)
    for rnd in range(n - 1):
        for src in range(n):
            dst = (src + 1) % n
            k = (src + 1 - rnd) % n
            got = network.send(src, dst, chunks[src][k])
            chunks[dst][k].copy_(got)


def reduce_scatter(chunks, network):
    """n - 1 steps; afterwards chunks[i][(i + 1) % n] holds the sum of that chunk over all workers."""
    n = len(chunks)
    # {SCRIPT}
    for rnd in range(n - 1):
        for src in range(n):
            dst = (src + 1) % n
            k = (src - rnd) % n
            got = network.send(src, dst, chunks[src][k])
            chunks[dst][k].add_(got)
'''

CY = '''\
def _around_the_ring(chunks, network, first, combine):
    count = len(chunks)
    for turn in range(count - 1):
        plan = [(me, (me + 1) % count, (me + first - turn) % count) for me in range(count)]
        for me, right, index in plan:
            combine(chunks[right][index], network.send(me, right, chunks[me][index]))


def reduce_scatter(chunks, network):
    _around_the_ring(chunks, network, 0, lambda held, arrived: held.add_(arrived))


def all_gather(chunks, network):
    _around_the_ring(chunks, network, 1, lambda held, arrived: held.copy_(arrived))


def ring_allreduce(data, network=None):
    if len(data) == 0:
        raise ValueError("ring_allreduce() got an empty list")
    net = network or RingNetwork([x.device for x in data])
    flat = []
    for x in data:
        flat.append(list(torch.tensor_split(x.view(-1), len(data))))
    with torch.no_grad():
        reduce_scatter(flat, net)
        all_gather(flat, net)
'''

DEE = '''\
def reduce_scatter(chunks, network):
    size = len(chunks)
    t = 0
    while t < size - 1:
        outgoing = [(w, (w - t) % size) for w in range(size)]
        arrived = [network.send(w, (w + 1) % size, chunks[w][c]) for w, c in outgoing]
        for (w, c), value in zip(outgoing, arrived):
            chunks[(w + 1) % size][c] += value
        t += 1


def all_gather(chunks, network):
    size = len(chunks)
    for t in range(1, size):
        for w in range(size):
            c = (w - t + 2) % size
            chunks[(w + 1) % size][c][:] = network.send(w, (w + 1) % size, chunks[w][c])


def ring_allreduce(data, network=None):
    if not len(data):
        raise ValueError("empty")
    if network is None:
        devices = []
        for item in data:
            devices.append(item.device)
        network = RingNetwork(devices)
    views = list(map(lambda item: list(item.view(-1).tensor_split(len(data))), data))
    with torch.no_grad():
        reduce_scatter(views, network)
        all_gather(views, network)
'''

# cy's ring passes, with ada's ring_allreduce copied under it: alike, less than bob's copy
GUS = CY[:CY.index("def ring_allreduce")] + ADA[ADA.index("def ring_allreduce"):]


def released() -> nbformat.NotebookNode:
    return nbformat.read(str(RELEASE), as_version=4)


def grade_id(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")


def answered(code: str) -> nbformat.NotebookNode:
    """The release with ``code`` typed into its answer cell."""
    nb = released()
    (cell,) = [c for c in nb.cells if grade_id(c) == "ring_answer"]
    cell.source = code
    return nb


def given_pasted() -> nbformat.NotebookNode:
    """The release untouched but for a cell of the learner's own holding its given code."""
    nb = released()
    (setup,) = [c for c in nb.cells if grade_id(c) == "ring_setup"]
    nb.cells.append(nbformat.v4.new_code_cell(setup.source))
    return nb


def handins() -> dict:
    return {"ada": answered(ADA), "bob": answered(BOB), "cy": answered(CY),
            "dee": answered(DEE), "eve": released(), "fay": given_pasted(),
            "gus": answered(GUS)}
