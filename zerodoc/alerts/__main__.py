import sys

from ..cli import guarded
from . import main

sys.exit(guarded(main))
