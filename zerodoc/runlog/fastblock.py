"""Interval and total lines read without building a Python object per number.

At 1,024 ranks every rank's new interval line (~1,000 per-unit numbers, ~15 KB) is read on
the refresh that brings it: `json.loads` made a Python float per number and
`block_from_dict` a numpy array from those lists again, ~0.47 ms a rank, most of a refit
(issue 33 item 4). Ranks of one job write the same layout: the same text around their
numbers (unit indices, phases, collectives, which columns are lists). So a line is cut into
that text (its *skeleton*) and its number tokens; the first line of a skeleton is read the
plain way (`block_from_dict`) and teaches where each token lands (a `_Template`: the unit
keys, and per array slot the token's position); every later line of that skeleton parses its
tokens in one numpy call and places them by index. The head (step numbers, scalars) is read
with `json.loads`, small.

Equal to the plain reading float for float, and never more lenient: tokens must be JSON
numbers (checked on the bytes: no leading zeros, a digit each side of a '.', signs only
where JSON puts them); a token the checks or numpy refuse sends the line the plain way,
which then says what is wrong (a bad line, counted as before). Tokens of up to 15 digits
without an exponent are read as integers with the '.' taken out, divided by a power of ten
(one correctly rounded division: the float `float()` gives, Clinger's fast path); others by
numpy's `fromstring` (the C library's correctly rounded strtod). A skeleton whose first line
the fast reading does not reproduce exactly is read the plain way from then on."""

from __future__ import annotations

import json
import re

import numpy as np

from .records import (
    SLACK, UnitsBlock, arrays_from_columns, check_record, framework_pairs, framework_sum,
    units_block,
)

FAST = True  # False: every line read the plain way (the tests' witness)
UNITS = b',"units":{'
_NUM_START = frozenset(b"0123456789-")
# a number that is a member's value (not a unit index: `"unit":81` says how many units)
_SCALAR = re.compile(rb'(?<=":)(?<!"unit":)(-?[0-9][-+.0-9eE]*)(?=[,}\]])')
_DIGITS_TO_1 = bytes.maketrans(b"123456789", b"111111111")
_EXP = re.compile(rb"[eE]([-+]?[0-9]+)(?=,|$)")  # an exponent, ending its token
_P10 = np.array([float(10 ** k) for k in range(23)])  # exact: 10**22 < 2**53 * 2**22
_FAST_MAX = 2 ** 53  # mantissas up to this are floats exactly (Clinger's fast path)

# skeleton -> its template; 1: seen once; False: read the plain way
_TEMPLATES: dict[tuple, object] = {}
READ_FAST = [0]  # lines read the fast way (the tests see that it was)


class _Template:
    """Where a skeleton's tokens go: unit keys, and the token index of every compute
    second, of every comm row's five numbers, and of each framework (key, seconds)."""

    __slots__ = ("ck", "cpos", "mk", "mpos", "fw", "count")

    def __init__(self, ck, cpos, mk, mpos, fw, count):
        self.ck, self.cpos, self.mk, self.mpos, self.fw, self.count = \
            ck, cpos, mk, mpos, fw, count


def split(units: bytes) -> tuple[tuple, list[bytes]] | None:
    """(skeleton, number tokens in document order) of a `units` object's text: the
    skeleton is the text between the tokens plus each list's length, so two texts of one
    skeleton differ only in numbers. Tokens: the contents of lists of numbers (not unit
    index lists) and the numbers that are a member's value. None: not a shape it knows."""
    texts: list[bytes] = [b""]
    holes: list[bytes] = []

    def text(t: bytes) -> None:
        parts = _SCALAR.split(t)
        texts[-1] += parts[0]
        for k in range(1, len(parts), 2):
            holes.append(parts[k])
            texts.append(parts[k + 1])

    pieces = units.split(b"[")
    buf = pieces[0]
    for p in pieces[1:]:
        if p[:1] and p[0] in _NUM_START and not buf.endswith(b'"unit":'):
            j = p.find(b"]")
            if j < 0:
                return None
            text(buf + b"[")
            holes.append(p[:j])
            texts.append(b"")
            buf = p[j:]
        else:
            buf += b"[" + p
    text(buf)
    return (tuple(texts), tuple(h.count(b",") for h in holes)), holes


def numbers(tokens: bytes, n: int) -> np.ndarray | None:
    """The `n` comma-separated JSON numbers in `tokens` as float64, each the float
    `json.loads` gives; None where a token is not a JSON number: the caller reads the line
    the plain way (which says what is wrong)."""
    rest = tokens.translate(None, b"0123456789.,")  # one pass: what is not digits
    if rest.translate(None, b"eE+-"):
        return None
    try:
        got = _digits(tokens, n, rest)
    except ValueError:  # a token that is not [-]digits[.digits][exponent]
        return None
    if got is not False:
        return got
    # a mantissa over 2**53 or a power of ten over 22: strtod, the bytes checked first
    if b".," in tokens or b",." in tokens or tokens[:1] == b"." or tokens[-1:] == b"." or \
            b".e" in tokens or b".E" in tokens or b"-." in tokens:
        return None
    z = tokens.translate(_DIGITS_TO_1, b"-")  # leading zeros: "01", "-01", "00.5"
    if z[:2] in (b"00", b"01") or b",00" in z or b",01" in z or \
            tokens.count(b"+") != tokens.count(b"e+") + tokens.count(b"E+") or \
            tokens.count(b"-") != tokens.count(b",-") + tokens.startswith(b"-") + \
            tokens.count(b"e-") + tokens.count(b"E-"):
        return None
    try:
        vals = np.fromstring(tokens, sep=",")
    except ValueError:
        return None
    if vals.size != n or tokens.count(b",") != n - 1:
        return None
    if _minus_zero(tokens):  # JSON's integer 0, strtod's -0.0
        vals[[t == b"-0" for t in tokens.split(b",")]] = 0.0
    return vals


def _isdigit(a: np.ndarray) -> np.ndarray:
    return (a - 48) < 10  # uint8: below '0' wraps high


def _digits(tokens: bytes, n: int, rest: bytes):
    """Each token's digits as one integer (the '.' and the exponent taken out), divided or
    multiplied by the power of ten they leave: one correctly rounded operation while the
    integer is at most 2**53 and the power at most 22 (else False: strtod reads them).
    None, or ValueError: a token that is not a JSON number (checked on the array: a digit
    each side of a '.', one '.' a token, '-' only first, no leading zero)."""
    exps = []
    if b"e" in rest or b"E" in rest:
        exps = [(tokens.count(b",", 0, e.start()), e.group(1)) for e in _EXP.finditer(tokens)]
        tokens = _EXP.sub(b"", tokens)
    if rest.count(b"+") != sum(e[:1] == b"+" for _t, e in exps):
        return None  # a '+' not starting an exponent
    minus = rest.count(b"-") - sum(e[:1] == b"-" for _t, e in exps)
    m = np.fromstring(tokens.replace(b".", b""), sep=",", dtype=np.int64)
    if m.size != n or tokens.count(b",") != max(n - 1, 0) or not n:
        return None if m.size != n or tokens else np.zeros(0)
    a = np.frombuffer(tokens, np.uint8)
    commas = np.flatnonzero(a == 44)
    starts = np.append(0, commas + 1)
    ends = np.append(commas, a.size)
    first = starts
    if minus:
        at = np.flatnonzero(a == 45)
        if at.size != minus or at[-1] == a.size - 1 or \
                not (((at == 0) | (a[at - 1] == 44)) & _isdigit(a[at + 1])).all():
            return None  # a '-' inside a token, or not before a digit
        first = starts + (a[starts] == 45)
    lead = (a[first] == 48) & (first + 1 < ends)  # "0" then more before the token's end
    if lead.any() and _isdigit(a[np.minimum(first + 1, a.size - 1)][lead]).any():
        return None
    dots = np.flatnonzero(a == 46)
    power = np.zeros(n, np.intp)  # the value is m * 10 ** -power
    if dots.size:
        if dots[0] == 0 or dots[-1] == a.size - 1 or \
                not (_isdigit(a[dots - 1]) & _isdigit(a[dots + 1])).all():
            return None  # ".5", "5.", "-.5"
        tok = np.searchsorted(commas, dots)  # the token of each '.'
        if dots.size > 1 and not (tok[1:] > tok[:-1]).all():
            return None  # two '.' in one token
        power[tok] = ends[tok] - dots - 1
    for t, e in exps:
        power[t] -= int(e)
    if m.max() > _FAST_MAX or m.min() < -_FAST_MAX or power.max() >= _P10.size or \
            power.min() <= -_P10.size:
        return False  # strtoll clamps beyond int64: a long mantissa lands here too
    if minus and ((m == 0) & (a[starts] == 45) & (power != 0)).any():
        return False  # -0.0: the integer 0 has no sign
    return np.where(power >= 0, m / _P10[np.maximum(power, 0)],
                    m * _P10[np.maximum(-power, 0)])


def _minus_zero(tokens: bytes) -> bool:
    """A token "-0" among `tokens`."""
    return tokens == b"-0" or tokens.startswith(b"-0,") or tokens.endswith(b",-0") or \
        b",-0," in tokens


def parse(line: bytes, unit_names: list[str]) -> tuple[UnitsBlock | None, tuple | None]:
    """(the block of an interval / total line as `block_from_dict(json.loads(line))` gives
    it, its skeleton and tokens). The block is None where the line is to be read the plain
    way (another shape, a token to check, a skeleton not learnt yet: then hand the plain
    block to `learn` with the second item). ValueError / KeyError / TypeError: what the
    plain reading raises too (a head or numbers that fail the checks: a bad line)."""
    at = line.find(UNITS)
    if at < 0 or not line.endswith(b"}}"):
        return None, None
    got = split(line[at + len(UNITS) - 1:-1])
    if got is None:
        return None, None
    skel, holes = got
    key = (tuple(unit_names), skel)
    tpl = _TEMPLATES.get(key)
    if not isinstance(tpl, _Template):
        return None, (key, holes)  # not learnt yet, or read the plain way for good
    vals = numbers(b",".join(holes), tpl.count)
    if vals is None:
        return None, None
    try:
        head = json.loads(line[:at] + b"}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, None  # the plain reading says why
    if not isinstance(head, dict) or head.get("type") not in ("interval", "total") or \
            "units" in head:
        return None, None
    b = _fill(head, tpl, vals, unit_names)
    READ_FAST[0] += 1
    return b, None


def _fill(head: dict, tpl: _Template, vals: np.ndarray, unit_names) -> UnitsBlock:
    """The block from the head's fields and the numbers placed by the template, checked as
    `block_from_dict` checks them."""
    check_record(head, len(unit_names))
    cv, mv = vals[tpl.cpos], vals[tpl.mpos]
    for a in (cv, mv):
        if a.size and not (np.isfinite(a).all() and (a >= -SLACK).all()):
            raise ValueError("per-unit numbers must be finite and >= 0")
    fw = framework_sum(zip(tpl.fw[0], vals[tpl.fw[1]].tolist())) if tpl.fw[0] else {}
    return units_block(head, (tpl.ck, cv, tpl.mk, mv), fw)


def learn(seen: tuple, line: bytes, unit_names: list[str], block: UnitsBlock) -> None:
    """After the plain reading of a line (`block`; `seen`: what `parse` said of it): the
    second line of a skeleton makes its template, kept when the fast reading of that line
    gives its block exactly (else the skeleton is read the plain way from then on). The
    first is only counted: a skeleton seen once (an irregular log) costs no template."""
    key, holes = seen
    got = _TEMPLATES.get(key)
    if got is None:
        if len(_TEMPLATES) > 256:
            _TEMPLATES.clear()
        _TEMPLATES[key] = 1
        return
    if got != 1:
        return
    _TEMPLATES[key] = tpl = _template(key[1], holes, unit_names)
    if tpl is None:
        return
    try:
        again, _ = parse(line, unit_names)
    except (ValueError, KeyError, TypeError, IndexError):
        again = None
    if again is None or not same_block(again, block):
        _TEMPLATES[key] = False


def _template(skel: tuple, holes: list[bytes], unit_names) -> _Template | None:
    """Where each token lands: the skeleton read by `json.loads` with every token replaced
    by its index, then by the plain column reader (so scalar columns, named columns and
    unit index lists are placed as the plain reading places them)."""
    texts, _counts = skel
    out, i = [texts[0]], 0
    for h, t in zip(holes, texts[1:]):
        n = h.count(b",") + 1
        out.append(b",".join(str(k).encode() for k in range(i, i + n)))
        out.append(t)
        i += n
    try:
        units = json.loads(b"".join(out))
        ck, cpos, mk, mpos = arrays_from_columns(units, unit_names)
        fw = framework_pairs(units, unit_names)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
        return None
    return _Template(ck, cpos.astype(np.intp), mk, mpos.astype(np.intp),
                     (tuple(k for k, _ in fw), np.array([p for _, p in fw], np.intp)), i)


def same_block(a: UnitsBlock, b: UnitsBlock) -> bool:
    """Two blocks equal field for field, their arrays element for element (signs of zero
    and NaNs too: byte for byte)."""
    for f in UnitsBlock.__slots__:
        if f in ("_dicts", "unit_arrays"):
            continue
        x, y = getattr(a, f), getattr(b, f)
        if type(x) is not type(y) or x != x and y == y or (x == x and x != y):
            return False
        if isinstance(x, float) and np.signbit(x) != np.signbit(y):
            return False
    (ack, acv, amk, amv), (bck, bcv, bmk, bmv) = a.unit_arrays, b.unit_arrays
    return ack == bck and amk == bmk and acv.dtype == bcv.dtype and amv.dtype == bmv.dtype \
        and acv.shape == bcv.shape and amv.shape == bmv.shape \
        and acv.tobytes() == bcv.tobytes() and amv.tobytes() == bmv.tobytes()
