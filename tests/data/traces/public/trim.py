"""Trim a Kineto trace to its first N profiler steps (events starting before the N-th step's
end), or, without step markers, to events starting before a fraction of its span."""
import gzip, json, sys
src, dst, n = sys.argv[1], sys.argv[2], sys.argv[3]
d = json.loads(gzip.decompress(open(src, 'rb').read()))
ev = d['traceEvents']
steps = sorted(e['ts'] + e['dur'] for e in ev if e.get('ph') == 'X' and str(e.get('name', '')).startswith('ProfilerStep#') and e.get('cat') != 'gpu_user_annotation')
if n.startswith('o'):  # the end of the N-th optimizer step
    cut = sorted(e['ts'] + e['dur'] for e in ev if e.get('ph') == 'X' and str(e.get('name', '')).startswith('Optimizer.step#'))[int(n[1:]) - 1]
elif n.startswith('f'):
    ts = [e['ts'] for e in ev if 'ts' in e and e.get('ph') == 'X' and e.get('cat') != 'Trace']
    cut = min(ts) + float(n[1:]) * (max(ts) - min(ts))
else:
    cut = steps[int(n) - 1]
keep = [e for e in ev if e.get('ph') == 'M' or 'ts' not in e or e.get('cat') == 'Trace' or e['ts'] < cut]
# the profiler's own span ends at the cut
for e in keep:
    if e.get('cat') == 'Trace' and 'dur' in e:
        e['dur'] = max(0, min(e['ts'] + e['dur'], cut) - e['ts'])
d['traceEvents'] = keep
raw = json.dumps(d).encode()  # HTA finds the rank as '"rank": N' (a space)
open(dst, 'wb').write(gzip.compress(raw, 9, mtime=0))
print(dst, len(ev), '->', len(keep), 'events', len(gzip.compress(raw, 9)), 'bytes')
