"""A stand-in for the pynvml module: two GPUs with scripted readings, optionally failing mid-run."""

import os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class FakeNvml:
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices=2, fail_after=None, init_error=None, no_power=False):
        self.devices = devices
        self.fail_after = fail_after
        self.init_error = init_error
        self.no_power = no_power
        self.calls = 0
        self.shutdown = False

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"Fake H200"

    def nvmlDeviceGetUtilizationRates(self, h):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise NVMLError("GPU is lost")
        return SimpleNamespace(gpu=10 * (h + 1), memory=5)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=2 * 2**30, total=8 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        if self.no_power:
            raise NVMLError_NotSupported("Not Supported")
        return 140_000  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetTemperature(self, h, kind):
        return 41

    def nvmlDeviceGetProcessUtilization(self, h, since):
        return [SimpleNamespace(pid=os.getpid(), smUtil=7, timeStamp=since + 1),
                SimpleNamespace(pid=1, smUtil=50, timeStamp=since + 1)]
