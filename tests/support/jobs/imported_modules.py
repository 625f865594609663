"""Which forbidden modules a statement imports, in a fresh interpreter.

    python tests/support/jobs/imported_modules.py STATEMENT FORBIDDEN_JSON

Executes STATEMENT (Python; an assertion in it fails the run, exit 1), then prints, comma
separated, every module in sys.modules that is a forbidden name or below one (a forbidden
`a` covers `a` and `a.*`, a dotted `a.b` covers `a.b.*`); an empty line when none. Used by
tests/test_imports.py (import hygiene) and tests/test_deepspeed.py (detection never imports
DeepSpeed).
"""

import json
import sys


def main() -> None:
    statement, forbidden = sys.argv[1], json.loads(sys.argv[2])
    exec(statement, {"__name__": "__job__"})
    bad = sorted(m for m in sys.modules if m.split(".")[0] in forbidden
                 or any(m.startswith(f + ".") for f in forbidden if "." in f))
    print(",".join(bad))


if __name__ == "__main__":
    main()
