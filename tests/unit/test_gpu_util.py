"""What an agent reports of its GPUs (``allot.services.agent.gpu_util``): NVML where a driver
is present, nothing (and why) where none is, as on this machine; fake profiles."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from allot.services.agent import gpu_util
from allot.services.agent.gpu_util import NvmlGpus, UtilMeans, fake_profile, fake_util


class FakeNvml:
    """The four pynvml calls the reader makes, over made-up GPUs."""

    def __init__(self, utils: list[float | Exception], fail_init: Exception | None = None):
        self.utils = utils
        self.fail_init = fail_init
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.fail_init is not None:
            raise self.fail_init

    def nvmlDeviceGetCount(self) -> int:
        return len(self.utils)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        value = self.utils[handle]
        if isinstance(value, Exception):
            raise value
        return SimpleNamespace(gpu=value, memory=0)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


def test_without_a_gpu_driver_the_real_pynvml_gives_no_reader_and_says_why() -> None:
    """This machine has no NVIDIA driver: ``nvmlInit`` fails (library not found) and the
    agent gets None and a reason, never an exception."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # a machine with a driver: the other path is the one to check there
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    reader, why = NvmlGpus.open(8)
    assert reader is None
    assert why.startswith("NVML did not start (no GPU driver?)")


def test_without_nvidia_ml_py_installed_there_is_no_reader_and_the_reason_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    reader, why = NvmlGpus.open(8)
    assert reader is None and why.startswith("nvidia-ml-py is not installed")


def test_a_driver_that_fails_to_start_gives_no_reader() -> None:
    reader, why = NvmlGpus.open(2, FakeNvml([1.0, 2.0], fail_init=OSError("driver not loaded")))
    assert reader is None and "driver not loaded" in why


def test_fewer_gpus_than_the_agent_was_given_is_refused_and_nvml_shut_down() -> None:
    nvml = FakeNvml([1.0])
    reader, why = NvmlGpus.open(2, nvml)
    assert reader is None and "NVML sees 1 GPUs; the agent was given 2" in why
    assert nvml.shutdowns == 1


def test_a_reading_has_each_gpus_percent_and_none_where_nvml_failed() -> None:
    reader, why = NvmlGpus.open(3, FakeNvml([12.0, RuntimeError("gone"), 300.0]))
    assert reader is not None and why == ""
    assert reader.read() == (12.0, None, None)  # 300% is no reading


def test_means_average_each_gpus_readings_and_start_again() -> None:
    means = UtilMeans(3, since=100.0)
    means.add((10.0, None, 4.0))
    means.add((20.0, None, 2.0))
    assert means.take(130.0) == (100.0, (15.0, None, 3.0))
    assert means.take(160.0) == (130.0, (None, None, None))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 90.0),
        ({"ALLOT_FAKE_UTIL": "idle"}, 1.0),
        ({"ALLOT_FAKE_UTIL": " IDLE "}, 1.0),
        ({"ALLOT_FAKE_UTIL": "busy"}, 90.0),
        ({"ALLOT_FAKE_UTIL": "3.5"}, 3.5),
        ({"ALLOT_FAKE_UTIL": "250"}, 90.0),
        ({"ALLOT_FAKE_UTIL": "nan"}, 90.0),
        ({"ALLOT_FAKE_UTIL": "lazy"}, 90.0),
    ],
)
def test_a_fake_parts_profile_comes_from_its_env(env: dict[str, str], expected: float) -> None:
    assert fake_profile(env) == expected


def test_a_fake_hosts_gpus_report_their_parts_profiles_and_free_ones_zero() -> None:
    parts = [((0, 1), {"ALLOT_FAKE_UTIL": "idle"}), ((3,), {}), ((9,), {})]
    assert fake_util(4, parts) == (1.0, 1.0, 0.0, 90.0)
    assert gpu_util.FAKE_UTIL_ENV == "ALLOT_FAKE_UTIL"
