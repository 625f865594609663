"""Rank stopped: a rank died or hangs, and the others are left waiting for it.

Why: the worst runs at 2 a.m. are not slow but stuck. Data-parallel ranks meet at every
collective, so when one rank dies (killed, OOM-killed, a segfault) or blocks (a deadlock, a
data loader that never returns, a layer that never finishes) every other rank waits in its
next collective until a timeout, and their logs all look alike. What matters is which rank
stopped first and where: that is the one to look at.

Evidence: per rank, the watchdog's last record (`snapshot.stalls`: stuck or failed, with
the step, unit, phase, the collective it waits in, since when, the innermost frame), the
clean closes (`snapshot.ended_ranks`), the stale ranks, each rank's last step. The rank
that stopped first is, in order: a rank stuck or failed *outside* a collective (it is what
the others wait for); else a rank that left no trace at all (no record and no clean close:
the process died, or hangs holding the interpreter lock) and made no step since the others
stopped; else the rank stuck in a collective since the earliest time. A rank stopped by a
signal (SIGTERM: a preemption, the scheduler, a kill; its watchdog's "terminated" record and
an end marked `"terminated": true`) ranks with those outside a collective, by time, and is
named as terminated, not as killed or crashed. Ranks stuck or failed
inside a collective are the ones left waiting. Every rank silent at the same last step (no
record, no clean close) is the whole job stopping at once (killed, preempted, its "end"
records lost with it): named as such (`whole_job`), with no rank first (`rank` None); every
rank terminated by a signal is the job stopped from outside (INFO, `whole_job`).
Severity: CRITICAL when a rank is stuck, failed or stale; WARNING when the only sign is a
missing clean close after every rank reached the same last step; INFO when every rank
recorded a SIGTERM.
Fix: look at that rank first: its own output, the kernel log (OOM killer), its Python stack
(`py-spy dump --pid PID`) if it still runs; the waiting ranks are symptoms.
"""

from __future__ import annotations

from ..findings import Severity
from ...humanize import secs
from .base import finding

CODE = "ZD013"
NAME = "rank-stopped"
SEVERITY = Severity.CRITICAL
TIER = 0
EXPLAINS = ("ZD004", "ZD006", "ZD010")  # the waits of a stuck run look like exposure

ACTIVE = ("stuck", "failed")
SIGNALLED = "terminated"  # the watchdog's record of a SIGTERM (watchdog.py `signalled`)
DUMPS = "flightrec"  # records made from flight-recorder dumps (zerodoc/sources/flightrec.py)


def _where(s: dict) -> str:
    if s.get("in") == "exception":  # a trainer integration saw training raise
        return f"an exception ({str(s.get('error') or '?')[:120]})"
    if not (s.get("unit") or s.get("phase") or s.get("collective")):
        # a step without per-unit detail, no unit, forward or backward frame on the stack and
        # not in the optimizer step (watchdog.py): between the units' work
        return ("code outside the sharded units, not in their forward or backward nor the "
                "optimizer (data loading, logging, a checkpoint, the user's code)")
    unit = s.get("unit") or "(outside the sharded units)"
    phase = s.get("phase") or "?"
    if s.get("collective"):
        return f"{s['collective'].replace('_', '-')} of {unit} ({phase})"
    kind = s.get("in") or "compute"
    what = {"compute": "compute or user code, not in a collective",
            "framework": "the framework's hooks", "optimizer": "the optimizer step",
            "outside units": "code outside the sharded units"}.get(kind, kind)
    return f"{unit} ({phase}, {what})"


def _how(s: dict) -> str:
    """How a rank stopped, as the head says it."""
    if s.get("state") == SIGNALLED:
        return f"terminated by {s.get('signal') or 'a signal'}"
    return "failed" if s.get("state") == "failed" else "stuck"


def _frame(s: dict) -> str | None:
    stack = s.get("stack") or []
    return stack[-1] if stack else None


def evaluate(ctx) -> list:
    snap = ctx.snapshot
    ranks = snap.ranks
    if not ranks:
        return []
    if any(w.facts.config.get("source") == DUMPS for w in ranks.values()):
        return _from_dumps(ctx)
    ended = set(snap.ended_ranks)
    current = {r: s for r, s in snap.stalls.items() if r in ranks and s.get("state") in ACTIVE}
    signalled = {r: s for r, s in snap.stalls.items()
                 if r in ranks and s.get("state") == SIGNALLED}
    stale = {r for r in snap.stale_ranks if r in ranks and r not in ended}
    silent = [r for r in ranks if r not in ended and r not in current and r not in signalled]

    def last_seen(r: int) -> float:
        w = ranks[r]
        return w.updated_unix or w.facts.started_unix or 0.0

    latest = max((float(s.get("since_unix") or 0.0) for s in current.values()), default=None)

    # ranks that ended, are stuck or went stale: counted once, so the check below is O(1) a
    # rank (it was a scan of every other rank for each: 2 M steps a refresh at 1,024 ranks)
    settled = {q for q in ranks if q in ended or q in current or q in stale}

    def stopped_silently(r: int) -> bool:
        others_settled = len(settled) - (r in settled)
        done = len(ranks) > 1 and others_settled == len(ranks) - 1
        behind = latest is not None and last_seen(r) <= latest
        return r in stale or done or behind

    gone = [r for r in silent if stopped_silently(r)]
    if not current and not gone:
        return _all_terminated(ranks, signalled)
    known = {**signalled, **current}  # the record of each rank that left one
    outside = sorted([*(r for r, s in current.items() if not s.get("collective")), *signalled],
                     key=lambda r: (float(known[r].get("since_unix") or 0.0), r))
    inside = sorted((r for r, s in current.items() if s.get("collective")),
                    key=lambda r: (int(current[r].get("step") or 0),
                                   float(current[r].get("since_unix") or 0.0), r))
    by_progress = sorted(gone, key=lambda r: (r not in stale, ranks[r].last_step,
                                              last_seen(r), r))
    first = (outside or by_progress or inside)[0]
    # every rank silent at the same last step: the job ended as a whole (its "end" records
    # lost with it), no rank is known to have gone first
    whole = (not current and len(ranks) > 1 and len(gone) == len(ranks)
             and len({ranks[r].last_step for r in ranks}) == 1)
    waiting = sorted(r for r in inside if r != first)
    also = sorted(r for r in [*outside, *gone] if r != first)

    if first in known:
        s = known[first]
        state = s["state"]
        where = _where(s)
        head = (f"rank {first} stopped first: {_how(s)} in {where}, step {s.get('step', '?')}")
        if state == "stuck" and s.get("stalled_s") is not None:
            head += f", no progress for {secs(float(s['stalled_s']))} when seen"
    elif whole:
        state = "stale" if first in stale else "gone"
        head = (f"the whole job stopped after step {ranks[first].last_step}: none of its "
                f"{len(ranks)} ranks closed cleanly or left a watchdog record (killed, "
                "preempted or crashed as a whole, or it never called close(); the run logs "
                "cannot tell which rank went first)")
    else:
        state = "stale" if first in stale else "gone"
        last = ranks[first].last_step
        head = (f"rank {first} stopped first: no clean close and no watchdog record after step "
                f"{last} (killed, crashed, or hung holding the interpreter lock)")
    tail = ""
    if waiting:
        w0 = current[waiting[0]]
        same = all(_where(current[r]) == _where(w0) for r in waiting)
        how = "failed waiting" if all(current[r]["state"] == "failed" for r in waiting) \
            else "wait"
        tail = (f"; rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} "
                f"{how} for it in {_where(w0) if same else 'their next collective'}"
                f" (step {w0.get('step', '?')})")
    only_unclosed = (not current and not stale and
                     len({ranks[r].last_step for r in ranks}) == 1)
    severity = Severity.WARNING if only_unclosed else Severity.CRITICAL
    own = known.get(first, {})
    evidence = {
        "rank": None if whole else first, "state": state,
        "step": own.get("step") if first in known else ranks[first].last_step + 1,
        "last_step": ranks[first].last_step,
        "since_unix": float(own.get("since_unix") or 0.0) if first in known
        else last_seen(first),
        "in": own.get("in"), "unit": own.get("unit"), "phase": own.get("phase"),
        "collective": own.get("collective") or None,
        "frame": _frame(own) if first in known else None,
        "error": own.get("error"), "signal": own.get("signal"),
        "waiting_ranks": waiting,
        "waiting": [{"rank": r, "state": current[r]["state"], "step": current[r].get("step"),
                     "unit": current[r].get("unit"), "phase": current[r].get("phase"),
                     "collective": current[r].get("collective"),
                     "since_unix": current[r].get("since_unix"),
                     "error": current[r].get("error")} for r in waiting],
        "also_stopped_ranks": also,
        # the issue-34 fields, shared with the dumps' finding: every rank named as stopped
        # first (one here), the group and sequence number (only the dumps say them), and how
        # sure: "high" from the rank's own record, "medium" from its silence, None: the
        # whole job
        "ranks": [] if whole else [first], "process_group": None, "sequence": None,
        "confidence": None if whole else "high" if first in known else "medium",
        "ended_ranks": sorted(ended),
        "stale_ranks": sorted(stale),
        "whole_job": whole,
    }
    if first in signalled:
        fix = (f"Look at who stopped rank {first}: it was {_how(own)} in {_where(own)} (a "
               "preemption, the scheduler's stop or time limit, a kill: the scheduler's record "
               "of the job says which); the other ranks only failed or waited after it. Resume "
               "from the last checkpoint.")
    elif first in current:
        fix = (f"Look at rank {first} first: it is stuck in {_where(current[first])}"
               + (f" at {evidence['frame']}" if evidence["frame"] else "")
               + f"; dump its Python stack (`py-spy dump --pid PID`, pid in its run log "
               f"header) and its output. The other ranks only wait for it.")
    elif whole:
        fix = ("Look at the job as a whole: the launcher's or scheduler's record of it (exit "
               "codes, a preemption, a time limit, Ctrl-C), each rank's output for the first "
               "error, the nodes' kernel logs for the OOM killer (`dmesg | grep -i kill`). A "
               "job that ends without calling close() (or `with zerodoc.attach(...)`) leaves "
               "the same trace.")
    else:
        fix = (f"Look at rank {first} first: its output (stderr, exit code), the node's kernel "
               f"log for the OOM killer (`dmesg | grep -i kill`), the scheduler's record of the "
               f"process; if it still runs, `py-spy dump --pid PID`. The other ranks only "
               f"waited for it.")
    return [finding(
        CODE, NAME, severity, head + tail, evidence=evidence,
        threshold={"stale_after_seconds": ctx.t.stale_after_seconds},
        fix=fix, ranks=tuple(sorted(ranks)) if whole else (first,),
        units=(evidence["unit"],) if evidence["unit"] else (),
        cost_seconds_per_step=0.0)]


def _all_terminated(ranks: dict, signalled: dict) -> list:
    """Every rank recorded a SIGTERM and closed: the job was stopped from outside, as a
    whole (INFO: a preemption or a time limit is routine, but the run did not finish)."""
    if not ranks or set(signalled) != set(ranks):
        return []
    last = max(ranks[r].last_step for r in ranks)
    sig = sorted({str(s.get("signal") or "a signal") for s in signalled.values()})
    head = (f"the whole job was terminated by {', '.join(sig)} after step {last}: every one of "
            f"its {len(ranks)} ranks recorded it and closed its run log (a preemption, the "
            "scheduler's stop or time limit, a kill)")
    first = min(signalled, key=lambda r: (float(signalled[r].get("since_unix") or 0.0), r))
    return [finding(
        CODE, NAME, Severity.INFO, head,
        evidence={"rank": None, "state": SIGNALLED, "step": last + 1, "last_step": last,
                  "signal": sig[0] if len(sig) == 1 else sig,
                  "since_unix": float(signalled[first].get("since_unix") or 0.0),
                  "waiting_ranks": [], "waiting": [], "also_stopped_ranks": [],
                  "ended_ranks": sorted(ranks), "stale_ranks": [], "whole_job": True},
        threshold={}, ranks=tuple(sorted(ranks)), cost_seconds_per_step=0.0,
        fix="The scheduler's record of the job says who stopped it; resume from the last "
            "checkpoint.")]


def _group(s: dict) -> str:
    desc = s.get("process_group_desc")
    return f"process group {s.get('process_group')}" + (f" ({desc})" if desc else "")


def _coll(s: dict) -> str:
    """'all-to-all #45267' from a dump's `nccl:all_to_all` and sequence number."""
    op = str(s.get("awaited") or s.get("collective") or "?").split(":", 1)[-1].lstrip("_")
    return f"{op.replace('_', '-')} #{s.get('sequence')}"


_DUMP_SAYS = {"behind": "its dump stops at #{last} of that group",
              "empty": "its dump is empty: it recorded nothing (a rank holding the interpreter "
                       "lock, or a dead GPU, cannot fill it)",
              "missing": "it left no dump (the process died, or could not write it)",
              "unreadable": "its dump cannot be read (cut off while written)"}


def _from_dumps(ctx) -> list:
    """The finding from PyTorch flight-recorder dumps (the source's verdict, carried in
    `snapshot.stalls` with `source: "flightrec"`): the ranks that did not reach the collective
    the others wait in, each with its group and sequence number. No step, unit or phase: a
    dump has none: a run log of the same job adds them (`--runlog`, the records' `place`)."""
    snap = ctx.snapshot
    stalls = {r: s for r, s in snap.stalls.items() if s.get("source") == DUMPS}
    roots = sorted(r for r, s in stalls.items() if s.get("in") == DUMPS)
    waiting = sorted(r for r, s in stalls.items() if s.get("in") != DUMPS)
    if not roots:  # no rank behind another: the source's notes say so
        return []
    first = roots[0]
    own = stalls[first]
    conf = own.get("confidence")
    parts = []
    for r in roots:
        s = stalls[r]
        says = _DUMP_SAYS.get(s.get("dump"), "").format(last=s.get("last_entered"))
        parts.append(f"rank {r} did not reach {_coll(s)} of {_group(s)} that rank"
                     f"{'s' if len(s.get('waited_by') or []) > 1 else ''} "
                     f"{_list(s.get('waited_by') or [])} wait in ({says})" + _placed(s))
    head = (f"rank{'s' if len(roots) > 1 else ''} {_list(roots)} stopped first (flight-"
            f"recorder dumps, confidence {conf}): " + "; ".join(parts))
    if conf == "low":
        head += (" -- but these ranks wait themselves, for each other (collectives issued "
                 "in a different order on different ranks) or for a member of a group the "
                 "dumps do not list (no pg_config in them: give --world-size when a rank's "
                 "dump is missing)")
    evidence = {
        "rank": first, "ranks": roots, "state": "stuck", "step": own.get("step"),
        "last_step": None, "since_unix": None, "in": None, "unit": own.get("unit"),
        "phase": own.get("phase"), "place": own.get("place"),
        "awaited_place": own.get("awaited_place"),
        "collective": own.get("awaited") or None, "frame": None, "error": None,
        "signal": None, "process_group": own.get("process_group"),
        "process_group_desc": own.get("process_group_desc"), "sequence": own.get("sequence"),
        "confidence": conf, "dump": {r: stalls[r].get("dump") for r in roots},
        "waiting_ranks": waiting,
        "waiting": [{"rank": r, "state": "stuck", "step": stalls[r].get("step"),
                     "unit": stalls[r].get("unit"), "phase": stalls[r].get("phase"),
                     "collective": stalls[r].get("collective"),
                     "process_group": stalls[r].get("process_group"),
                     "sequence": stalls[r].get("sequence"),
                     "waits_for": stalls[r].get("waits_for"), "since_unix": None,
                     "error": None} for r in waiting],
        "also_stopped_ranks": roots[1:], "ended_ranks": [], "stale_ranks": [],
        "whole_job": False}
    fix = (f"Look at rank{'s' if len(roots) > 1 else ''} {_list(roots)} first: their output "
           "(stderr, exit code), the node's kernel log (`dmesg`: Xid GPU errors, the OOM "
           "killer), their Python stack if they still run (`py-spy dump --pid PID`). The "
           f"{len(waiting)} waiting rank{'s' if len(waiting) != 1 else ''} only wait for them.")
    return [finding(CODE, NAME, Severity.CRITICAL, head, evidence=evidence, threshold={},
                    fix=fix, ranks=tuple(roots),
                    units=(evidence["unit"],) if evidence["unit"] else (),
                    cost_seconds_per_step=0.0)]


def _placed(s: dict) -> str:
    """Where a zerodoc run log of the same job places a stopped rank (`--runlog`): after
    its last collective, in that collective's unit and phase; else where the awaited one
    was issued; "" when no log placed it."""
    p, a = s.get("place"), s.get("awaited_place")
    last = p.get("sequence", s.get("last_entered")) if p else None
    if p and (p.get("stopped_in") or {}).get("unit"):
        at = p["stopped_in"]
        out = (f"; it stopped in {at['unit']} ({at['phase']}) of step {p['step']}, after "
               f"its {str(p['collective']).replace('_', '-')} #{last} (of {p['unit']})")
    elif p and p.get("offset") is None:  # a rank without a dump: its log's newest step
        out = f"; it stopped in step {p['step']}"
    elif p:
        out = (f"; it stopped in step {p['step']}, after #{last}, a collective no zerodoc "
               "wrapper issued")
    elif a:
        return (f"; the awaited collective is {a['unit'] or 'outside the sharded units'}"
                f" ({a['phase'] or '?'}) of step {a['step']} (run log of rank "
                f"{a['from_rank']})")
    else:
        return ""
    if a and a.get("unit"):
        out += (f", before {a['unit']}'s {str(a['collective']).replace('_', '-')} "
                f"({a['phase']})")
    if p.get("confidence") == "runlog":
        return out + (f" (run log of rank {p['from_rank']} alone, not its dump: its last "
                      "collective is the one before the awaited, which its peers completed"
                      if p.get("offset") else f" (run log of rank {p['from_rank']} alone: "
                      "the step after its newest step record") + ")"
    return out + (f" (run log of rank {p['from_rank']}"
                  + (f"; {p['steps_past_log']} step(s) past its newest step line, the "
                     "schedule taken to repeat" if p.get("steps_past_log") else "") + ")")


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 12 else \
        f"{', '.join(map(str, ranks[:12]))} and {len(ranks) - 12} more"
