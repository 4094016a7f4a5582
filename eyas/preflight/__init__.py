"""Preflight: minutes on the GPU host that prove every GPU piece of the run before the
days-long phases start (`eyas.preflight.run`). Six checks, each a module: `environment`,
`disk`, `collectives`, `capture`, `training`, `serving`; `result` holds their verdicts and
the go/no-go report, `proc` bounds the processes they start."""
