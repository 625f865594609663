"""How the larger traces here were trimmed (README.md): keep the events that start before a cut,
unchanged, and the metadata; the profiler's own span ends at the cut.

    python trim.py SRC.json.gz DST.json.gz N     # cut: the end of the N-th ProfilerStep
    python trim.py SRC.json.gz DST.json.gz oN    # cut: the end of the N-th Optimizer.step
"""

import gzip
import json
import sys


def ends(events: list, prefix: str) -> list:
    """Sorted ends of the host's spans named `prefix...` (not the device's copies of them)."""
    return sorted(e["ts"] + e["dur"] for e in events if e.get("ph") == "X"
                  and str(e.get("name", "")).startswith(prefix)
                  and e.get("cat") != "gpu_user_annotation")


def main(src: str, dst: str, n: str) -> None:
    d = json.loads(gzip.decompress(open(src, "rb").read()))
    ev = d["traceEvents"]
    cut = ends(ev, "Optimizer.step#")[int(n[1:]) - 1] if n.startswith("o") else \
        ends(ev, "ProfilerStep#")[int(n) - 1]
    keep = [e for e in ev if e.get("ph") == "M" or "ts" not in e or e.get("cat") == "Trace"
            or e["ts"] < cut]
    for e in keep:
        if e.get("cat") == "Trace" and "dur" in e:
            e["dur"] = max(0, min(e["ts"] + e["dur"], cut) - e["ts"])
    d["traceEvents"] = keep
    raw = json.dumps(d).encode()  # HTA finds the rank as '"rank": N' (with the space)
    open(dst, "wb").write(gzip.compress(raw, 9, mtime=0))
    print(dst, len(ev), "->", len(keep), "events")


if __name__ == "__main__":
    main(*sys.argv[1:4])
