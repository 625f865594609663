"""A small YAML emitter for the rule files (dicts, lists, strings, numbers): the generator
stays standard-library only, and the output stays readable (block scalars for PromQL)."""

from __future__ import annotations

import json
import re


def _plain_ok(s: str) -> bool:
    """True if `s` reads back as the same string when written as a plain YAML scalar."""
    if not re.fullmatch(r"[A-Za-z0-9_(][^\n]*", s) or s != s.strip():
        return False
    if ": " in s or " #" in s or s.endswith(":") or '"' in s or "'" in s:
        return False
    if s.lower() in ("true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"):
        return False
    try:
        float(s)
        return False
    except ValueError:
        return not re.fullmatch(r"[0-9_:.+-]+", s)


def scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    if _plain_ok(s):
        return s
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def _emit(obj, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and "\n" in v:
                out.append(f"{pad}{k}: |-")
                out.extend(f"{pad}  {ln}" if ln else "" for ln in v.split("\n"))
            elif isinstance(v, (dict, list)):
                if v:
                    out.append(f"{pad}{k}:")
                    _emit(v, indent + 2, out)
                else:
                    out.append(f"{pad}{k}: {'{}' if isinstance(v, dict) else '[]'}")
            else:
                out.append(f"{pad}{k}: {scalar(v)}")
    elif isinstance(obj, list):
        for item in obj:
            sub: list[str] = []
            if isinstance(item, (dict, list)):
                _emit(item, indent + 2, sub)
            else:
                sub.append(" " * (indent + 2) + scalar(item))
            out.append(f"{pad}- {sub[0][indent + 2:]}")
            out.extend(sub[1:])


def dump(obj) -> str:
    out: list[str] = []
    _emit(obj, 0, out)
    return "\n".join(out) + "\n"
