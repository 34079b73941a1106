"""The result contract: one name per figure in every result object and every ``--json`` output.

- ``qps``: **ok** answers per second of the measured window (errors, timeouts and rejections are not
  throughput); ``texts_per_s`` beside it where one request carries several texts;
- ``p50_ms`` / ``p99_ms``: latency percentiles over every outcome of the window;
- ``model_busy`` (share of the window inside the model call, host launch included) and ``device_busy``
  (share of the window the device computes), 0 to 1;
- ``device``: always one object, ``{"kind": "cpu" | "cuda" | "simulated", "name", "profile", "source"}``;
- ``schema_version``: in every ``--json`` output, :data:`SCHEMA_VERSION`.

Charts (:mod:`tuning.viz`) and renderers (:mod:`tuning.present`) read this contract, never guess among
shapes. ``throughput_rps`` (every outcome per second, the offline summary's old headline) is kept one release
as a deprecated key beside ``qps`` (:data:`DEPRECATED_KEYS`).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

SCHEMA_VERSION = 1
DEVICE_KINDS = ("cpu", "cuda", "simulated")
DEVICE_KEYS = ("kind", "name", "profile", "source")
FIGURE_KEYS = ("qps", "p50_ms", "p99_ms", "model_busy", "device_busy", "device")


@runtime_checkable
class Measured(Protocol):
    """What every measured result offers a chart or a report: the contract's figures and its summary."""

    @property
    def qps(self) -> float: ...

    @property
    def p50_ms(self) -> float: ...

    @property
    def p99_ms(self) -> float: ...

    @property
    def model_busy(self) -> float: ...

    @property
    def device_busy(self) -> float: ...

    @property
    def device(self) -> dict[str, Any]: ...

    def summary(self) -> dict[str, Any]: ...


def device_object(kind: str, name: str | None = None, profile: str | None = None, source: str | None = None,
                  **extra: Any) -> dict[str, Any]:
    """The one ``device`` object: ``kind`` (cpu, cuda or simulated), ``name``, ``profile`` (the simulated
    device's profile, else None) and ``source`` (``measured``, or where a simulated profile's figures come
    from); ``extra`` keys follow them."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"device kind={kind!r} is not allowed; allowed: {' | '.join(DEVICE_KINDS)}")
    return {"kind": kind, "name": name, "profile": profile, "source": source, **extra}


def as_device(value: Any) -> dict[str, Any] | None:
    """The contract's device object from what a caller holds: the object itself (its missing keys filled),
    a :class:`tuning.sim.DeviceChoice` (``as_dict``), or a result that carries one (``.device``). None: unknown."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if "kind" not in value:
            return None
        return {**{k: None for k in DEVICE_KEYS}, **value}
    if hasattr(value, "knob") and hasattr(value, "label"):  # a device choice
        as_dict = getattr(value, "as_dict", None)
        if callable(as_dict):
            return as_device(as_dict())
        kind = {"sim": "simulated"}.get(value.knob, value.knob)
        return device_object(kind, value.label, source=None, label=value.label,
                             simulated=bool(getattr(value, "simulated", False)))
    summary = getattr(value, "summary", None)  # what --json prints: the result's own word on its device
    if callable(summary):
        try:
            device = summary().get("device")
        except Exception:  # a chart's label must not fail because a summary cannot be made (an empty sweep)
            device = None
        if isinstance(device, Mapping):
            return as_device(device)
    device = getattr(value, "device", None)
    if isinstance(device, Mapping):
        return as_device(device)
    workload = getattr(value, "workload", None)  # a recorder's Profile: its workload's device
    return as_device(workload) if workload is not None and workload is not value else None


def with_schema(payload: Any) -> Any:
    """``payload`` with ``schema_version`` first (a mapping), or wrapped as ``{"schema_version", "rows"}`` (a list)."""
    if isinstance(payload, Mapping):
        return {"schema_version": SCHEMA_VERSION, **payload}
    if isinstance(payload, (list, tuple)):
        return {"schema_version": SCHEMA_VERSION, "rows": list(payload)}
    return payload
