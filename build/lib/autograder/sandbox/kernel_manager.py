"""jupyter_client's side of a submission's kernel: a kernel manager class that papermill
and nbclient instantiate, whose kernel process a :class:`~autograder.sandbox.spawn.Spawner` starts.

:func:`manager_class` binds one :class:`KernelLaunch` (working directory, environment,
sandbox policy, log) to a kernel manager; its provisioner hands jupyter_client's command
line to the spawner as the target :data:`autograder.protocol.KERNEL_TARGET`, so a forked
and a fresh kernel start the same way, with the environment the grader writes
(:func:`autograder.sandbox.policy.process_environment` and the launch's own), never its own. The
launch records the process so a watchdog can kill it when the notebook's time is up.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from autograder.protocol import KERNEL_TARGET
from autograder.sandbox.policy import process_environment
from autograder.sandbox.processes import kill_all
from autograder.sandbox.spawn import Spawner


def _provisioner_class():
    from jupyter_client.provisioning import LocalProvisioner
    from traitlets import Any as AnyTrait

    class SpawnedProvisioner(LocalProvisioner):
        """LocalProvisioner whose ``launch_kernel`` asks the run's spawner, not Popen."""
        launch = AnyTrait()

        async def launch_kernel(self, cmd: List[str], **kwargs):
            if "ipykernel_launcher" not in cmd:
                return await super().launch_kernel(cmd, **kwargs)
            argv = list(cmd[cmd.index("ipykernel_launcher") + 1:])
            cwd = str(kwargs.get("cwd") or os.getcwd())
            launch: KernelLaunch = self.launch
            self.process = launch.spawner.start(
                KERNEL_TARGET, json.dumps(launch.sandbox) if launch.sandbox else "", *argv,
                cwd=cwd, env=dict(kwargs["env"]), stderr=launch.log)
            self.pid = self.process.pid
            self.pgid = self.pid  # it has a session of its own
            self.cwd = cwd
            return self.connection_info

        async def wait(self):
            # LocalProvisioner polls every 0.1 s; a killed kernel is gone within milliseconds.
            if self.process is None:
                return 0
            while self.process.poll() is None:
                await asyncio.sleep(0.01)
            code, self.process = self.process.returncode, None
            return code

    return SpawnedProvisioner


def _quick_client_class():
    from queue import Empty

    from jupyter_client.asynchronous import AsyncKernelClient

    class QuickStartClient(AsyncKernelClient):
        """jupyter_client's client, minus 0.2 s of waiting for IOPub silence at start-up.

        Its ``wait_for_ready`` ends by draining IOPub until nothing arrives for 0.2 s.
        nbclient matches every output to the request that caused it, so a status message
        left over from start-up is ignored anyway; the rest of the handshake is unchanged.
        """

        async def wait_for_ready(self, timeout: Optional[float] = None) -> None:
            deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
            while True:
                self.kernel_info()
                try:
                    reply = await self.shell_channel.get_msg(timeout=1)
                except Empty:
                    pass
                else:
                    if reply["msg_type"] == "kernel_info_reply":
                        try:  # IOPub connected? (else start over, as jupyter_client does)
                            await self.iopub_channel.get_msg(timeout=0.2)
                        except Empty:
                            pass
                        else:
                            self._handle_kernel_info_reply(reply)
                            return
                if not await self._async_is_alive():
                    raise RuntimeError("Kernel died before replying to kernel_info")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kernel didn't respond in {timeout} seconds")

    return QuickStartClient


@dataclass
class KernelLaunch:
    """How to start one submission's kernel, and (once started) which process it is."""
    cwd: Path
    spawner: Spawner
    env: Dict[str, str] = field(default_factory=dict)
    threads: Optional[int] = None  # CPU threads for PyTorch/OpenMP in the kernel
    log: Optional[str] = None      # file for the kernel's own stderr (start-up failures)
    sandbox: Optional[dict] = None  # a policy.Policy as a dict: confine the kernel so
    sockets: Optional[Path] = None  # a folder for the kernel's Unix sockets (with sandbox)
    manager: object = None         # the kernel manager, set once the kernel starts
    killed: bool = False
    _started_pid: Optional[int] = None

    def kill(self) -> None:
        """Kill the kernel's whole process group now (the notebook watchdog calls this)."""
        self.killed = True
        self.stop()

    @property
    def pid(self) -> Optional[int]:
        """The kernel's process id, once it has started."""
        provisioner = getattr(self.manager, "provisioner", None)
        return getattr(provisioner, "pid", None)

    def stop(self) -> None:
        """Kill the kernel and everything it started, if any of it is still running."""
        provisioner = getattr(self.manager, "provisioner", None)
        pid = self.pid or self._started_pid
        if pid:
            self._started_pid = pid
            if kill_all(pid) == 0 and getattr(provisioner, "process", None) is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)  # no /proc: the process group at least
                except (ProcessLookupError, PermissionError):
                    pass


def manager_class(launch: KernelLaunch):
    """An AsyncKernelManager subclass bound to ``launch`` (for nbclient's kernel_manager_class)."""
    from jupyter_client.manager import AsyncKernelManager

    class SubmissionKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.client_factory = _quick_client_class()
            if launch.sockets is not None and sys.platform.startswith("linux"):
                # Unix sockets: they reach a kernel in a network namespace of its own (see
                # confine._confine_network); TCP would not. Not in its working directory,
                # which the kernel sees as a tmpfs of its own that the grader cannot.
                # (Linux only: that is where the namespace is, and macOS's long temporary
                # paths could pass its 104-byte limit for a socket's path.)
                self.transport = "ipc"
                self.ip = str(Path(launch.sockets) / "kernel")

        async def _async_wait(self, pollinterval: float = 0.01) -> None:
            # After a kill, look every 10 ms (not 100 ms) whether the kernel has gone.
            await super()._async_wait(pollinterval=min(pollinterval, 0.01))

        async def _async_pre_start_kernel(self, **kw):
            kw["cwd"] = str(launch.cwd)
            env = process_environment()  # written by the grader, not its own
            env.update(launch.env)
            if launch.threads:
                for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                    env[name] = str(launch.threads)
            kw["env"] = env
            if self.provisioner is None:
                self.kernel_id = self.kernel_id or str(uuid.uuid4())
                self.provisioner = _provisioner_class()(
                    kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self,
                    launch=launch)
            launch.manager = self
            return await super()._async_pre_start_kernel(**kw)

    return SubmissionKernelManager
