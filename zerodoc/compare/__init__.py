"""`zerodoc compare`: a run's predictions judged against what was observed.

judge.py: the comparison (predicted against observed, per finding); noise.py: the runs' own
noise the changes are judged against, and whether a run is still being written; history.py:
the outcome history fed back into findings; render.py: text / Markdown / JSON of a comparison.
The comparison's names are importable from here (``from zerodoc.compare import compare``).
"""

from .judge import *  # noqa: F401,F403  the facade: compare(), side(), ...
