"""Compare configs across devices: per-device winners, cross-device regret, portable choices.

Definitions (times are the decision statistic in microseconds, zhantune.bench.decision.decision_us; a
config measured several times on a device, as close calls are, counts with its lowest measurement
there, as in the exported tables: zhantune.bench.decision.best_per_config):

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
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zhantune.bench.decision import (
    DEFAULT_MIN_SPEEDUP,
    best_per_config,
    claim_status,
    decision_us,
)
from zhantune.errors import UserError
from zhantune.inductor.builder import table_torch
from zhantune.storage.engine import redact_url

if TYPE_CHECKING:
    from zhantune.storage import Store

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
        return statistics.geometric_mean(self.regret.values())


@dataclass(frozen=True)
class Claim:
    """A device's winner's speedup over Inductor's default as its newest stored verdict says
    (Store.latest_verdicts; ratios of the default's time to the winner's, paired rounds' median,
    lowest and highest; torch_version: the torch the rounds ran with). ``confirmed``: the claim
    the export ships (zhantune.bench.decision.claim_status: this torch's release, the rule in use,
    at least ``min_speedup``); else ``reason`` says why not. Never the unpaired stored times."""

    confirmed: bool
    reason: str
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    rounds: int = 0
    torch_version: str | None = None


@dataclass
class ProblemComparison:
    """One problem across the devices: best times (us), each device's winner, Inductor's default
    time where measured, the regrets of the winners elsewhere, and the portable choices."""

    problem_key: str
    flops: int
    best_us: dict[str, float]              # device -> best time
    winner: dict[str, Choice]              # device -> its winner (regret on every device it ran on)
    default_us: dict[str, float]           # device -> Inductor's default time, where measured
    regret: dict[tuple[str, str], float]   # (A, B) -> regret of A's winner on B
    portable: Choice | None                # min worst regret
    portable_geomean: Choice | None        # min geometric-mean regret
    #: device -> its winner's speedup claim over Inductor's default there (:class:`Claim`)
    claims: dict[str, Claim] = field(default_factory=dict)

    @property
    def confirmed_speedup(self) -> dict[str, float]:
        """Device -> its winner's speedup over Inductor's default where a claim was confirmed in
        paired, interleaved rounds with this torch release and clears ``min_speedup`` (what the
        export ships); a device without one has no claim."""
        return {d: c.ratio for d, c in self.claims.items() if c.confirmed and c.ratio is not None}

    @property
    def disagreement(self) -> float | None:
        """The largest regret of any device's winner on any other device (1.0: all agree); None when
        no winner was measured on another device (nothing compared: not an agreement)."""
        return max((r for (a, b), r in self.regret.items() if a != b), default=None)


@dataclass
class Comparison:
    """Every compared problem, and the device x device matrix of geometric-mean regrets."""

    devices: list[str]
    device_names: dict[str, str]
    problems: list[ProblemComparison]
    matrix: dict[tuple[str, str], float | None]  # geometric-mean regret of A's winners on B
    min_speedup: float | None = DEFAULT_MIN_SPEEDUP  # what each Claim was judged at
    #: device key -> how many problems were measured on it alone (left out of a comparison of several)
    left_out: dict[str, int] = field(default_factory=dict)
    #: the torch whose release's rows were compared, and device key -> rows of other releases left out
    torch: str | None = None
    other_torch: dict[str, int] = field(default_factory=dict)

    def most_disagreeing(self, n: int = 5) -> list[ProblemComparison]:
        return sorted(self.problems, key=lambda p: -(p.disagreement or 0.0))[:n]


def _pick_devices(store: Store, wanted: list[str] | None) -> list[Any]:
    devices = store.devices()
    if not devices:
        raise CompareError(f"storage.url={redact_url(store.url)}: the database holds no devices; tune or import first "
                           "(python -m zhantune ..., python -m zhantune.kerneltuner files=[...])")
    if wanted:
        by_name = {d.key: d for d in devices}
        names = Counter(d.name for d in devices)
        for d in devices:  # a name stands for its device when no other device has it (nor that key)
            if d.name not in by_name:
                by_name[d.name] = d if names[d.name] == 1 else None
        for i, d in enumerate(devices):  # a number as export's device=N (its errors list them so)
            other = by_name.setdefault(str(i), d)
            if other is not d and str(i) in wanted:  # a device named "1" and device number 1 (session 48)
                raise CompareError(f"device {str(i)!r} (from devices) is the name of {other.key!r} and the number of "
                                   f"{d.key!r}; give a key" if other is not None else
                                   f"device {str(i)!r} (from devices) is a name of several devices and the number of "
                                   f"{d.key!r}; give a key")
        several = next((w for w in wanted if w in by_name and by_name[w] is None), None)
        if several is not None:
            raise CompareError(f"device {several!r} (from devices) names several devices: "
                               f"{', '.join(repr(d.key) for d in devices if d.name == several)}; give a key")
        unknown = [w for w in wanted if w not in by_name]
        if unknown:
            raise CompareError(f"unknown device {unknown[0]!r} (from devices); allowed: "
                               f"{', '.join(f'{i}: {d.key!r}' for i, d in enumerate(devices))} (a number, a key or a name)")
        devices = list({by_name[w].id: by_name[w] for w in wanted}.values())
    return devices


def compare(store: Store, devices: list[str] | None = None,
            min_speedup: float | None = DEFAULT_MIN_SPEEDUP) -> Comparison:
    """Compare the devices (keys, names or numbers; None: all) over every problem measured on two or more;
    with one device, over every problem measured on it (its winners; every regret is 1). Each
    winner's claim over Inductor's default (:class:`Claim`) is judged as the export judges it, at
    ``min_speedup`` (None: any confirmed claim).

    Raises CompareError (exit code 2) for an empty database, an unknown device, or no problem
    measured on two of the devices (on the device, for one).
    """
    devs = _pick_devices(store, devices)
    ids = {d.id: d.key for d in devs}
    torch = table_torch(None)  # times and claims as this torch's export ranks and ships them
    other_torch: Counter = Counter()
    releases: set[str] = set()
    time, failed, configs, default_us = _times(store, ids, torch, other_torch, releases)
    problems = store.problems(list(time))
    verdicts, any_torch = store.latest_verdicts(torch), store.latest_verdicts()
    key_ids = {key: dev_id for dev_id, key in ids.items()}
    out, left_out = [], Counter()
    for pid in sorted(time, key=lambda i: problems[i].key):
        per_dev = {d: t for d, t in time[pid].items() if t}
        if len(per_dev) < min(2, len(devs)):
            left_out.update(list(per_dev))  # device keys
            continue
        p = _compare_problem(problems[pid], per_dev, failed[pid], configs, default_us.get(pid, {}))
        # the winner's own claim on its device (re-judged by the rule in use), never another
        # config's: the chart draws it as the speedup of the best config
        for d, w in p.winner.items():
            key = (key_ids[d], pid, w.config_hash)
            p.claims[d] = _claim(verdicts.get(key), any_torch.get(key), min_speedup, torch)
        out.append(p)
    if not out:
        raise CompareError((f"no problem was measured on two of the devices {', '.join(repr(d.key) for d in devs)}"
                            if len(devs) > 1 else f"no correct measurement on {devs[0].key!r} in {redact_url(store.url)}")
                           + (f" with a build of this torch {torch} ({sum(other_torch.values())} measurement(s) of "
                              f"torch {', '.join(sorted(releases))} are not compared: run compare with that torch)"
                              if other_torch else ""))
    keys = [d.key for d in devs]
    matrix: dict[tuple[str, str], float | None] = {}
    for a in keys:
        for b in keys:
            regrets = [p.regret[(a, b)] for p in out if (a, b) in p.regret]
            matrix[(a, b)] = statistics.geometric_mean(regrets) if regrets else None
    return Comparison(keys, {d.key: d.name for d in devs}, out, matrix, min_speedup, dict(left_out), torch,
                      dict(other_torch))


def _claim(verdict: Any, other_torch: Any, min_speedup: float | None, torch: str) -> Claim:
    why = claim_status(verdict, other_torch, min_speedup, torch)
    v = verdict if verdict is not None else other_torch  # the one the reason names (another torch's: it says so)
    if v is None:
        return Claim(False, why or "")
    return Claim(why is None, why or f"confirmed in {v.rounds} paired rounds", v.ratio, v.ratio_low, v.ratio_high,
                 v.rounds or 0, v.torch_version)


def _times(store: Store, ids: dict[int, str], torch: str, other_torch: Counter,
           releases: set[str]) -> tuple[dict, dict, dict, dict]:
    """From the devices' rows (``ids``: device id -> key) measured with a build of ``torch``'s release
    (or recorded GPU data, imported from Kernel Tuner or replayed, whatever torch), as the export ranks them:
    time[problem id][device key][config hash] (each config at its lowest decision statistic, the
    ranking rule of the export), failed[problem id][device key] = config hashes whose candidates
    failed there (a wrong output, a compile or runtime error, a timeout; not a killed worker's
    ``crashed`` nor ``not_applied``; one wrong output there, ``incorrect``, makes a config failed
    however many ``ok`` rows it has: Store.incorrect_configs), configs[config hash] = (template_id, params),
    default_us[problem id][device key] (Inductor's default, lowest too). ``other_torch`` counts the
    rows of other torch releases left out, by device key; ``releases`` gets those releases."""
    from zhantune.provenance import torch_release
    from zhantune.storage.ingest import IMPORTED_VERSION
    from zhantune.storage.queries import FAILED_STATUSES

    ok: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    defaults: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    failed: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    configs: dict[str, tuple[str | None, dict]] = {}
    release = torch_release(torch)
    rows, every = [], store.config_rows(list(ids), ("candidate", "remeasure", "default"))
    # recorded GPU data (a replay's rows carry the replaying torch, an import's none) holds for any torch
    recorded = {pid for pid, p in store.problems(list({r.problem_id for r in every})).items() if p.dtype == "recorded"}
    for row in every:
        if row.torch_version == IMPORTED_VERSION or row.problem_id in recorded or torch_release(row.torch_version) == release:
            rows.append(row)
        else:
            other_torch[ids[row.device_id]] += 1
            releases.add(str(torch_release(row.torch_version)))
    wrong = {(r.problem_id, r.device_id, r.config_hash) for r in rows if r.status == "incorrect" and r.kind != "default"}
    for row in rows:
        dev, good = ids[row.device_id], row.status == "ok" and decision_us(row) is not None
        good = good and (row.problem_id, row.device_id, row.config_hash) not in wrong
        if row.kind == "default":
            if good:
                defaults[row.problem_id][dev].append(row)
            continue
        if row.config_hash is None:
            continue
        configs.setdefault(row.config_hash, (row.template_id, row.params))
        if good:
            ok[row.problem_id][dev].append(row)
        elif (row.problem_id, row.device_id, row.config_hash) in wrong or (
                row.kind == "candidate" and row.status in FAILED_STATUSES):
            # a wrong output in any row (a re-measurement's too: session 48's attack showed one as never
            # measured), a candidate's failure; a killed worker's row (crashed) or a template not applied
            # is no measurement of the config, as for the export (Store.incorrect_configs)
            failed[row.problem_id][dev].add(row.config_hash)
    time = {pid: {dev: {r.config_hash: decision_us(r) for r in best_per_config(rows)} for dev, rows in by_dev.items()}
            for pid, by_dev in ok.items()}
    default_us = {pid: {dev: decision_us(best_per_config(rows)[0]) for dev, rows in by_dev.items()}
                  for pid, by_dev in defaults.items()}
    return time, failed, configs, default_us


def _compare_problem(problem: Any, per_dev: dict[str, dict[str, float]], failed: dict[str, set[str]],
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
