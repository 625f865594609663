"""`zerodoc compare`: a run's predictions judged against what was observed.

judge.py: the comparison (predicted against observed, per finding); history.py: the outcome
history fed back into findings; render.py: text / Markdown / JSON of a comparison.
The comparison's names are importable from here (``from zerodoc.compare import compare``).
"""

from .judge import *  # noqa: F401,F403  the facade: compare(), side(), ...
