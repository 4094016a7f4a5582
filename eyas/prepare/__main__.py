"""``python -m eyas.prepare merge|tokenize --config FILE --workdir DIR``: see `phases.main`."""

from eyas.prepare.phases import main

raise SystemExit(main())
