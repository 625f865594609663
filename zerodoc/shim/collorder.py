"""Which unit and phase issue which collective of a step, by process-group sequence number.

A flight-recorder dump (zerodoc/sources/flightrec.py) names the collective a job hangs in by
its process group and `collective_seq_id`: the group's sequence number, advanced by one at
every collective issued on it (`ProcessGroup._get_sequence_number_for_group()` reads the
same number: after the k-th collective it is k, and that collective's id is k; torch 2.13,
gloo). Two records let `zerodoc report DUMPS --runlog RUNDIR` turn that number into a unit
and phase:

- each step record carries `seq`: every group's number at the step's end (`SeqCounter`,
  read there anyway for the step's collective count: no cost added on the training thread
  but a list kept);
- on a detail step the per-unit comm wrappers note each collective they issue: its group,
  the group's number just before it, the unit, the phase and the kind (`issued`, one C call
  and one append; on no other step). At the step's end `take` turns them into each group's
  `[offset, unit, phase, kind]` rows (offset 1: the group's first collective of the step)
  and its count in the step; the monitor writes them as a `collorder` record only when they
  change (a repeating schedule: once).

A collective the wrappers do not see (the user's own all-reduce of a loss, DDP's buffer
broadcast) has no row: its offset is simply missing, and the others keep their exact offsets,
as each row holds the group's number read at its own issue. A wrapped call that may issue
several collectives (DeepSpeed's coalesced all-gather: one per tensor under torch's
coalescing manager) notes the number before and after it (`begin` / `end`): one row per
collective it issued. Nothing here can raise into the job: a group whose number cannot be
read is left out.

What "unit" means per engine (docs/runlog.md): FSDP2 and FSDP1, the sharded module whose
parameters the collective moves; ZeRO-1 (and DDP), "(model)" for every collective (the
gradient buckets and the parameter broadcasts); DeepSpeed, the unit the comm wrapper books
the call on (ZeRO-3: the fetch's unit; the gradient buckets, grad-norm and post-step
collectives: "(model)").
"""

from __future__ import annotations

from . import hookpoints as hp
from .recorder import COLLECTIVES, PHASES

# Collectives noted a step at most (a ZeRO-1 job without `parameters_as_bucket_view` broadcasts
# every parameter: thousands): past it a collective has no row, as an unwrapped one, and the
# record stays under ~60 KB, written once a schedule.
MAX_ROWS = 4096


class CollOrder:
    """The collectives of the current detail step, in issue order (module docstring)."""

    __slots__ = ("rec", "items", "_readers", "registry")

    def __init__(self, rec, registry=None):
        self.rec = rec  # the recorder: its `phase` is the phase a collective is issued in
        self.items: list[tuple] = []
        self._readers: dict = {}  # group -> its sequence reader, or False (unreadable)
        self.registry = registry

    def issued(self, group, unit: int, coll: int) -> None:
        """A wrapper issues collective `coll` of `unit` on `group` (None: the default)."""
        f = self._readers.get(group)
        if f is None:
            f = self._readers[group] = self._reader(group)
        if f and len(self.items) < MAX_ROWS:
            try:
                self.items.append((group, f(), unit, self.rec.phase, coll))
            except Exception:  # noqa: BLE001 - a destroyed group: no row, never an error
                self._readers[group] = False

    def begin(self, group, unit: int, coll: int):
        """As `issued`, for a call that may issue several collectives: a token for `end`
        (None: unreadable group)."""
        f = self._readers.get(group)
        if f is None:
            f = self._readers[group] = self._reader(group)
        if f and len(self.items) < MAX_ROWS:
            try:
                items = self.items
                items.append((group, f(), unit, self.rec.phase, coll))
                return items, len(items) - 1, f
            except Exception:  # noqa: BLE001 - as in `issued`
                self._readers[group] = False
        return None

    def end(self, token) -> None:
        """The call of `begin`'s `token` returned: one row per collective it issued (none
        issued: no row)."""
        items, i, f = token
        try:
            group, before, unit, phase, coll = items[i]
            n = f() - before
        except Exception:  # noqa: BLE001 - a destroyed group: keep the one row
            return
        if n != 1:
            items[i] = (group, before, unit, phase, coll, n)

    def _reader(self, group):
        try:
            return hp.sequence_reader(group)
        except Exception as e:  # noqa: BLE001 - private: fail soft
            if self.registry is not None:
                self.registry.missing("ProcessGroup._get_sequence_number_for_group", repr(e))
            return False

    def take(self, start: dict[str, int], end: dict[str, int]) -> dict:
        """This step's rows per group name: {name: {"n": collectives in the step, "at":
        [[offset, unit, phase, kind], ...]}} (unit, phase, kind: indices into the record's
        `units`, `phases`, `kinds`: `record()`), from the groups' numbers at the step's
        `start` and `end` (by name). Clears the list."""
        items, self.items = self.items, []
        out: dict[str, dict] = {}
        names: dict = {}  # group -> its name, looked up once a step, not once a row
        for it in items:  # (group, before, unit, phase, kind[, collectives: `end`])
            group = it[0]
            name = names.get(group)
            if name is None:
                name = names[group] = hp.group_name(group)
            s0 = start.get(name)
            if s0 is None or name not in end:
                continue
            g = out.get(name)
            if g is None:
                g = out[name] = {"n": end[name] - s0, "at": []}
            off = it[1] + 1 - s0
            if len(it) == 5:
                g["at"].append([off, it[2], it[3], it[4]])
            else:  # one row per collective the call issued
                g["at"].extend([off + k, it[2], it[3], it[4]]
                               for k in range(min(it[5], MAX_ROWS)))
        return out


def record(step: int, groups: list[str], order: dict, units: list[str]) -> dict:
    """The `collorder` run-log record (docs/runlog.md): the rows' indices name `units`,
    `phases` and `kinds` in the record itself (written once a schedule: a few KB at 81
    units, 14 B a step over a 240-step log)."""
    return {"type": "collorder", "step": step, "groups": groups, "units": units,
            "phases": list(PHASES), "kinds": list(COLLECTIVES), "order": order}
