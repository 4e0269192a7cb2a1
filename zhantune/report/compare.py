"""Compare configs across devices: per-device winners, cross-device regret, portable choices.

Definitions (times are median microseconds; a config measured several times on a device, as close
calls are, counts with its median measurement there, as in the exported tables):

* the *winner* of device A for a problem is A's fastest correct config;
* the *regret* of A's winner on B is time_B(winner_A) / best_B (1.0: no loss). It exists only where
  the winner was also measured on B; a winner that failed on B has infinite regret;
* the *portable choice* for a problem is the config, correct on every compared device, that
  minimises the worst regret over the devices (ties broken by the geometric mean); the
  *geometric-mean choice* minimises the geometric mean of the regrets instead;
* the device x device *regret matrix* holds, for A's winners run on B, the geometric mean of the
  regrets over the problems where both were measured.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from zhantune.errors import UserError
from zhantune.storage import Store
from zhantune.storage import models as m
from zhantune.storage.store import decision_value

__all__ = ["Choice", "ProblemComparison", "Comparison", "compare", "CompareError"]


class CompareError(UserError):
    """Nothing (or not enough) to compare: an empty database, an unknown device, no shared problem."""


@dataclass(frozen=True)
class Choice:
    """A config and how it does on each device (``regret`` per device key)."""

    config_hash: str
    template_id: str | None
    params: dict[str, Any] = field(hash=False)
    regret: dict[str, float] = field(hash=False)

    @property
    def worst_regret(self) -> float:
        return max(self.regret.values())

    @property
    def geomean_regret(self) -> float:
        return _geomean(list(self.regret.values()))


@dataclass
class ProblemComparison:
    problem_key: str
    flops: int
    best_us: dict[str, float]              # device -> best time
    winner: dict[str, Choice]              # device -> its winner (regret on every device it ran on)
    default_us: dict[str, float]           # device -> Inductor's default time, where measured
    regret: dict[tuple[str, str], float]   # (A, B) -> regret of A's winner on B
    portable: Choice | None                # min worst regret
    portable_geomean: Choice | None        # min geometric-mean regret

    @property
    def disagreement(self) -> float:
        """The largest regret of any device's winner on any other device (1.0: all agree)."""
        return max((r for (a, b), r in self.regret.items() if a != b), default=1.0)


@dataclass
class Comparison:
    devices: list[str]
    device_names: dict[str, str]
    problems: list[ProblemComparison]
    matrix: dict[tuple[str, str], float | None]  # geometric-mean regret of A's winners on B

    def most_disagreeing(self, n: int = 5) -> list[ProblemComparison]:
        return sorted(self.problems, key=lambda p: -p.disagreement)[:n]


def _geomean(values: list[float]) -> float:
    if any(math.isinf(v) for v in values):
        return math.inf
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _pick_devices(store: Store, wanted: list[str] | None) -> list[m.Device]:
    with store.session() as s:
        devices = list(s.scalars(select(m.Device).order_by(m.Device.key)))
    if not devices:
        raise CompareError(f"storage.url={store.url}: the database holds no devices; tune or import first "
                           "(python -m zhantune ..., python -m zhantune.kerneltuner files=[...])")
    if wanted:
        by_name = {d.key: d for d in devices} | {d.name: d for d in devices}
        unknown = [w for w in wanted if w not in by_name]
        if unknown:
            raise CompareError(f"unknown device {unknown[0]!r} (from devices); allowed: "
                               f"{', '.join(repr(d.key) for d in devices)}")
        devices = list({by_name[w].id: by_name[w] for w in wanted}.values())
    return devices


def compare(store: Store, devices: list[str] | None = None) -> Comparison:
    """Compare the devices (keys or names; None: all) over every problem measured on two or more;
    with one device, over every problem measured on it (its winners; every regret is 1).

    Raises CompareError (exit code 2) for an empty database, an unknown device, or no problem
    measured on two of the devices (on the device, for one).
    """
    devs = _pick_devices(store, devices)
    ids = {d.id: d.key for d in devs}
    # times[problem][device][config_hash] = ok medians (candidate and re-measure rows);
    # failed[problem][device] = config hashes that failed
    times: dict[int, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    failed: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    configs: dict[str, tuple[str | None, dict]] = {}
    defaults: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    problems: dict[int, m.Problem] = {}
    with store.session() as s:
        q = (select(m.Measurement.problem_id, m.Measurement.device_id, m.Measurement.kind,
                    m.Measurement.status, m.Measurement.config_hash, m.Measurement.template_id,
                    m.Measurement.params, m.Measurement.median_us, m.Measurement.min_us,
                    m.Measurement.timing_method)
             .where(m.Measurement.device_id.in_(ids),
                    m.Measurement.kind.in_(("candidate", "remeasure", "default"))))
        for pid, did, kind, status, chash, tid, params, median, low, method in s.execute(q):
            dev = ids[did]
            median = decision_value(low, median, method)  # the decision statistic, as export ranks
            if kind == "default":
                if status == "ok" and median is not None:
                    defaults[pid][dev].append(median)
                continue
            if chash is None:
                continue
            configs.setdefault(chash, (tid, params))
            if status == "ok" and median is not None:
                times[pid][dev][chash].append(median)
            elif kind == "candidate":
                failed[pid][dev].add(chash)
    # each row by the decision statistic and a config (or the default) measured several times by
    # its lowest: the rule of Store.ranked_candidates and Store.default_times_us, so compare and
    # export agree (zhantune.storage.store.decision_us)
    time = {pid: {dev: {h: min(ts) for h, ts in per.items()} for dev, per in by_dev.items()}
            for pid, by_dev in times.items()}
    default_us = {pid: {dev: min(ts) for dev, ts in by_dev.items()} for pid, by_dev in defaults.items()}
    with store.session() as s:
        for p in s.scalars(select(m.Problem).where(m.Problem.id.in_(list(time)))):
            problems[p.id] = p
    out = []
    for pid in sorted(time, key=lambda i: problems[i].key):
        per_dev = {d: t for d, t in time[pid].items() if t}
        if len(per_dev) < min(2, len(devs)):
            continue
        out.append(_compare_problem(problems[pid], per_dev, failed[pid], configs, default_us.get(pid, {})))
    if not out:
        raise CompareError(f"no problem was measured on two of the devices {', '.join(repr(d.key) for d in devs)}"
                           if len(devs) > 1 else f"no correct measurement on {devs[0].key!r} in {store.url}")
    keys = [d.key for d in devs]
    matrix: dict[tuple[str, str], float | None] = {}
    for a in keys:
        for b in keys:
            regrets = [p.regret[(a, b)] for p in out if (a, b) in p.regret]
            matrix[(a, b)] = _geomean(regrets) if regrets else None
    return Comparison(keys, {d.key: d.name for d in devs}, out, matrix)


def _compare_problem(problem: m.Problem, per_dev: dict[str, dict[str, float]], failed: dict[str, set[str]],
                     configs: dict[str, tuple[str | None, dict]], default_us: dict[str, float]) -> ProblemComparison:
    best_us = {d: min(t.values()) for d, t in per_dev.items()}

    def regret_on(chash: str, dev: str) -> float | None:
        if chash in per_dev[dev]:
            return per_dev[dev][chash] / best_us[dev]
        if chash in failed.get(dev, ()):
            return math.inf
        return None  # never measured there

    def choice(chash: str) -> Choice:
        regrets = {d: r for d in per_dev if (r := regret_on(chash, d)) is not None}
        tid, params = configs[chash]
        return Choice(chash, tid, params, regrets)

    winners = {d: choice(min(t, key=lambda h: (t[h], h))) for d, t in per_dev.items()}
    regret = {(a, b): w.regret[b] for a, w in winners.items() for b in per_dev if b in w.regret}
    everywhere = set.intersection(*(set(t) for t in per_dev.values()))
    portable = geo = None
    if everywhere:
        choices = [choice(h) for h in sorted(everywhere)]
        portable = min(choices, key=lambda c: (c.worst_regret, c.geomean_regret))
        geo = min(choices, key=lambda c: (c.geomean_regret, c.worst_regret))
    return ProblemComparison(problem.key, problem.flops, best_us, winners, dict(default_us), regret, portable, geo)
