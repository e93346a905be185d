"""GPU utilization as an agent reports it: read through NVML on a real host, simulated on a
fake one. The agent sends each host's per-GPU means once per ``--util-every-s``
(``HostUtilization``); the health service judges them (``allot.eventlog.idle_watch``).

**Real hosts** read NVML through ``nvidia-ml-py`` (``import pynvml``): ``NvmlGpus.open``
initialises it and takes a handle per GPU index (the agent's GPU ``i`` is NVML device
``i``, as ``CUDA_VISIBLE_DEVICES`` numbers them when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
With no driver, no library or no such GPU it returns None and the reason (the agent then
reports nothing and says why once), never an exception: a host without GPUs (this
project's CI) runs the agent as before. Each reading is ``nvmlDeviceGetUtilizationRates``
(the percent of the last sample period the GPU was busy), taken every few seconds;
``UtilMeans`` averages them over the report interval. A GPU NVML cannot read this time is
None in that reading, and a GPU never read in an interval is reported null (no evidence).

**Fake hosts** run no process, so a workload says how busy it pretends to be in its
submission's ``env``: ``ALLOT_FAKE_UTIL=idle`` (1%), ``busy`` (90%, the default) or a number
of percent (``ALLOT_FAKE_UTIL=3``). Each GPU of a running part reports its profile, a free
GPU 0%. ``allot submit --env ALLOT_FAKE_UTIL=idle ...`` makes a squatter to try the idle
detection on ``allot up``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FAKE_UTIL_ENV = "ALLOT_FAKE_UTIL"
FAKE_PROFILES = {"idle": 1.0, "busy": 90.0}
DEFAULT_FAKE_PROFILE = "busy"
SAMPLE_S = 5.0
"""How often a real agent reads NVML (at most; never less than once per report)."""

Reading = tuple[float | None, ...]


def fake_profile(env: Mapping[str, str]) -> float:
    """The utilization a fake part pretends (``FAKE_UTIL_ENV`` of its submission's env):
    a profile name, or percent 0..100; anything else is the default profile."""
    raw = env.get(FAKE_UTIL_ENV, DEFAULT_FAKE_PROFILE).strip().lower()
    if raw in FAKE_PROFILES:
        return FAKE_PROFILES[raw]
    try:
        value = float(raw)
    except ValueError:
        return FAKE_PROFILES[DEFAULT_FAKE_PROFILE]
    return value if math.isfinite(value) and 0.0 <= value <= 100.0 else FAKE_PROFILES["busy"]


def fake_util(gpus: int, parts: Iterable[tuple[Sequence[int], Mapping[str, str]]]) -> Reading:
    """A fake host's GPUs: each part's GPUs at its profile, the rest at 0%."""
    util = [0.0] * gpus
    for indices, env in parts:
        value = fake_profile(env)
        for g in indices:
            if 0 <= g < gpus:
                util[g] = value
    return tuple(util)


class NvmlGpus:
    """A host's GPUs read through NVML (see the module docstring)."""

    def __init__(self, nvml: Any, handles: Sequence[Any]) -> None:
        self._nvml = nvml
        self._handles = tuple(handles)

    @classmethod
    def open(cls, gpus: int, nvml: Any | None = None) -> tuple[NvmlGpus | None, str]:
        """The reader of GPUs ``0..gpus-1`` and ``""``, or None and why not. ``nvml``: the
        ``pynvml`` module (imported here when not given)."""
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as e:
                return None, f"nvidia-ml-py is not installed ({e})"
        try:
            nvml.nvmlInit()
        except Exception as e:  # pynvml.NVMLError and its many subclasses; OSError
            return None, f"NVML did not start (no GPU driver?): {e}"
        try:
            count = int(nvml.nvmlDeviceGetCount())
            if count < gpus:
                raise RuntimeError(f"NVML sees {count} GPUs; the agent was given {gpus}")
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
        except Exception as e:
            _shutdown(nvml)
            return None, f"NVML cannot read the GPUs: {e}"
        return cls(nvml, handles), ""

    def read(self) -> Reading:
        """One reading: each GPU's utilization in percent, None where NVML failed."""
        out: list[float | None] = []
        for handle in self._handles:
            try:
                value = float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:
                out.append(None)
                continue
            out.append(value if 0.0 <= value <= 100.0 else None)
        return tuple(out)

    def close(self) -> None:
        _shutdown(self._nvml)


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # shutting down a library that failed: nothing left to do
        return


class UtilMeans:
    """Per-GPU means of the readings since the last ``take``."""

    def __init__(self, gpus: int, since: float) -> None:
        self.since = since
        self._sums = [0.0] * gpus
        self._counts = [0] * gpus

    def add(self, reading: Reading) -> None:
        for i, value in enumerate(reading[: len(self._sums)]):
            if value is not None:
                self._sums[i] += value
                self._counts[i] += 1

    def take(self, now: float) -> tuple[float, Reading]:
        """(start of the interval, each GPU's mean or None if never read); starts anew."""
        means = tuple(
            round(s / n, 3) if n else None for s, n in zip(self._sums, self._counts, strict=True)
        )
        since, self.since = self.since, now
        self._sums = [0.0] * len(self._sums)
        self._counts = [0] * len(self._counts)
        return since, means


__all__ = [
    "FAKE_PROFILES",
    "FAKE_UTIL_ENV",
    "SAMPLE_S",
    "NvmlGpus",
    "UtilMeans",
    "fake_profile",
    "fake_util",
]
