"""``python -m eyas.prepare merge|tokenize --config FILE --workdir DIR``: see `phases.main`."""

from eyas.prepare.phases import main
from eyas.stopping import run_main

raise SystemExit(run_main(main, "eyas.prepare"))
