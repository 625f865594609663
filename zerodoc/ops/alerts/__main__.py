import sys

from ...cli.main import guarded
from . import main

sys.exit(guarded(main))
