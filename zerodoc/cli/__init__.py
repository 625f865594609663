"""The `zerodoc` command line: one module per command, argument parsing and printing only.

`main.py` holds the entry point (`zerodoc = zerodoc.cli.main:main`) and the list of
commands; each command module defines ``add_parser(subparsers)``. What a command computes
lives in the library (the engines, `zerodoc.ops`, `zerodoc.compare`), never here.
"""
