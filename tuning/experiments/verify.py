"""Holding the claim (``docs/deciding.md``, stage 5): the capacity the target check claims, held open-loop for
minutes before it is shipped.

The check's windows last seconds and start from an empty queue. Near a server's ceiling a queue takes tens of
seconds to settle, and a server whose pace falls as its queue grows (more connections, longer batching queues,
a load client sharing its cores) answers a short window at a rate it cannot keep: such a window passes at a rate
that misses the target within minutes. A hold is one open-loop window of ``seconds`` at the claimed rate, judged
on its outcomes after the first :data:`SETTLE_SHARE` of it (the queue filling from empty), at least
:data:`MIN_JUDGED` of them: it holds when their p99 is within the target and the server answered at the rate
offered (:data:`~tuning.experiments.capacity.KEEP_UP`). One that does not hold is followed by one lower: at
:data:`STEP` of its rate, or of the pace the server kept when it fell behind (the pace past its ceiling, measured
over the hold), never under :data:`FLOOR` of its rate; :data:`HOLD_TRIES` rates at most. The claim is held by
one hold (the target check chose it; the hold is a fresh test of it), a lower rate by two in a row: the holds
chose that rate as the first that held, so on a rate at the edge, where one hold is a coin, its first hold
passed by selection, and a fresh hold is the test (stage 3's look and fresh window, over minutes). A hold whose
tail the client's own send lag explains is the client's figure: held again at the same rate once, then the holds
stop (the client's limit, not the server's). A hold with no ok answer stops them: the server failed. The capacity
shipped is the highest rate held; none held, the claim is withdrawn with what each hold measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from tuning.base.format import fixed, rounded
from tuning.experiments.capacity import answered_enough, hold_check
from tuning.experiments.trial import Trial

SETTLE_SHARE = 1 / 3  # a hold's first third is the queue filling from empty: not judged
MIN_JUDGED = 400  # a hold judges at least this many arrivals (stage 3's shortest window): longer at a low rate
STEP = 0.9  # a hold that did not hold: the next at this share of its rate, or of the pace kept when it fell behind
FLOOR = 0.75  # ...never under this share of its rate (a pace that collapsed under an overload is not the server's)
HOLD_TRIES = 3  # rates at most, the claim's first: 5 holds (and one more at a rate where the client's lag spoiled one)


@dataclass
class Hold:
    """One hold: its rate, how long, the judged outcomes' check (:func:`~tuning.experiments.capacity.hold_check`),
    what was answered ok and offered per second (in the hold's unit), the hold's unit, whether it is a look (a
    lower rate's first hold: where it holds, a fresh hold follows, and the rate is not held yet) and whether it is
    the fresh hold at a rate whose look held."""

    rate: float
    seconds: float
    check: dict[str, Any]
    qps: float
    offered: float
    unit: str = "req/s"
    look: bool = False
    fresh: bool = False

    @property
    def kept_up(self) -> bool:
        return answered_enough(self.qps, self.offered)

    @property
    def lagged(self) -> bool:
        """The client's send lag explains the tail: the client's figure, not the server's."""
        return bool(self.check.get("lag_explains"))

    @property
    def held(self) -> bool:
        p99 = self.check.get("p99_ms")
        return bool(p99 is not None and p99 <= self.check["target_p99_ms"] and self.kept_up and not self.lagged)

    def why_not(self) -> str | None:
        """Why it did not hold, in words (None: it held)."""
        if self.held:
            return None
        c = self.check
        if self.lagged:
            return "the client lagged its schedule (the client's figure, not the server's)"
        if not self.kept_up:
            return (f"the server fell behind: {self.qps:.1f} {self.unit} answered of {self.offered:.1f} offered")
        failed = c.get("errors") or 0
        if c.get("p99_ms") is None and failed:  # over 1% failed: the p99 is a failure
            return f"{failed} of {c.get('n')} outcomes failed"
        return f"p99 {fixed(c.get('p99_ms'), '.0f')} ms over the {c['target_p99_ms']:.0f} ms target"

    def row(self) -> dict[str, Any]:
        return {"rate": rounded(self.rate), "seconds": rounded(self.seconds), "held": self.held,
                "look": self.look, "fresh": self.fresh, "kept_up": self.kept_up, "answered": rounded(self.qps),
                "offered": rounded(self.offered),
                "why_not": self.why_not(), **{k: self.check.get(k) for k in (
                    "p99_ms", "p99_low_ms", "p99_high_ms", "share", "share_high", "n", "errors", "lag_p99_ms")}}


@dataclass
class Verified:
    """The claim's holds, in order; ``held`` the highest rate held: the claim by one hold, a lower rate by its
    fresh hold too (None: none, or the holds could not tell: ``error``, or a Ctrl-C: ``interrupted``)."""

    claim: float
    seconds: float
    target_p99_ms: float
    unit: str = "req/s"
    holds: list[Hold] = field(default_factory=list)
    error: str | None = None  # why the holds stopped without a verdict: the server failed, the client lagged
    interrupted: bool = False

    @property
    def held(self) -> float | None:
        return next((h.rate for h in self.holds if h.held and not h.look), None)

    def summary(self) -> dict[str, Any]:
        return {"claim": rounded(self.claim), "seconds": rounded(self.seconds), "held": rounded(self.held),
                "unit": self.unit, "settle_share": rounded(SETTLE_SHARE), "error": self.error,
                "interrupted": self.interrupted, "holds": [h.row() for h in self.holds]}

    def sentence(self) -> str:
        """What the holds said, in one line (:func:`held_sentence`)."""
        return held_sentence(self.summary())


def held_sentence(v: dict[str, Any]) -> str:
    """What a claim's holds said (``Verified.summary()``, also as read back from summary.json), in one line."""
    u, s = v["unit"], f"{v['seconds']:.0f} s"
    holds = v.get("holds") or []
    held = v.get("held")
    last = next((h for h in reversed(holds) if h["held"] and h["rate"] == held), None) if held is not None else None
    # lower rates whose first hold held, not held by a fresh one (it missed, or never came)
    once = [f"{h['rate']:.1f}" for h in holds if h["held"] and h.get("look") and h["rate"] != held]
    if last is not None:
        twice = " twice (a fresh hold after the first)" if last.get("fresh") else ""
        said = (f"held {last['rate']:.1f} {u} for {s}{twice}: p99 {fixed(last['p99_ms'], '.0f')} ms "
                f"[{fixed(last['p99_low_ms'], '.0f')}-{fixed(last['p99_high_ms'], '.0f')}] over its last "
                f"{100 * (1 - v['settle_share']):.0f}%, {fixed(last['share'], '.2f', scale=100)}% over the target")
        said += f", client lag p99 {last['lag_p99_ms']:.0f} ms" if last.get("lag_p99_ms") is not None else ""
    elif v.get("interrupted"):
        said = f"INTERRUPTED during the holds of the claim {v['claim']:.1f} {u}: nothing held yet"
    elif v.get("error"):
        said = f"COULD NOT HOLD: {v['error']}"
    elif once:
        said = f"NOT HELD: no rate held twice in a row in holds of {s} (a lower rate needs a fresh hold too)"
    else:
        said = f"NOT HELD: no hold of {s} met the target"
    said += f"; held once at {', '.join(once)}" if once else ""
    missed = [f"{h['rate']:.1f} ({'its fresh hold: ' if h.get('fresh') else ''}{h['why_not']})"
              for h in holds if not h["held"]]
    return said + (f"; did not hold at {'; '.join(missed)}" if missed else "")


def hold_claim(hold: Callable[[float, float, float], Trial], claim: float, seconds: float, target_p99_ms: float,
               unit: str = "req/s", tries: int = HOLD_TRIES,
               on_hold: Callable[[Verified], None] | None = None, into: Verified | None = None) -> Verified:
    """Hold ``claim`` (see the module doc). ``hold(rate, settle_s, judged_s) -> Trial``: one open-loop window at
    ``rate`` whose first ``settle_s`` are not measured and whose next ``judged_s`` are; ``on_hold(verified)``
    runs after each hold (progress, the files); ``into``: the :class:`Verified` to fill (the caller's, so that a
    Ctrl-C keeps what was held)."""
    if not (claim > 0 and math.isfinite(claim)):
        raise ValueError(f"claim={claim!r}: a hold needs a positive rate")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r}: a hold lasts a positive time (0 skips the holds)")
    if into is not None and into.claim != claim:
        raise ValueError(f"into.claim={into.claim!r} is not claim={claim!r}: hold a claim into its own record")
    out = into if into is not None else Verified(claim, seconds, target_p99_ms, unit)
    rate, lag_retried, rates, looked = claim, False, 1, False  # looked: this rate's first hold held
    while True:
        settle = SETTLE_SHARE * seconds
        trial = hold(rate, settle, max(seconds - settle, MIN_JUDGED / rate))
        if not trial.ok:  # nothing answered: the server's failure, not a rate it cannot keep
            out.error = f"no ok answer in the hold at {rate:.1f} {unit} (first error: {trial.first_error})"
            break
        offered = trial.offered_rate if math.isfinite(trial.offered_rate) else rate
        h = Hold(rate, seconds, hold_check(trial, target_p99_ms), trial.qps, offered, unit,
                 look=rates > 1 and not looked, fresh=looked)
        out.holds.append(h)
        if on_hold is not None:
            on_hold(out)
        if h.held and not h.look:
            break
        if h.held:  # the holds chose this rate: its fresh hold is the test
            looked = True
            continue
        if h.lagged:
            if lag_retried:
                out.error = (f"the client lagged its schedule in two holds at {rate:.1f} {unit}: the client's limit, "
                             "not the server's (hold it from a client on other cores)")
                break
            lag_retried = True
            continue
        if rates >= tries:
            break
        rates, looked, lag_retried = rates + 1, False, False
        rate *= STEP if h.kept_up else max(STEP * min(1.0, h.qps / rate), FLOOR)
    return out
