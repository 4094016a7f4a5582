"""eyas: train EAGLE-3 drafters for your own LLM, in one orchestrated, resumable run.

This package is the Prefect-free core. GPU hosts install it without Prefect; the
`flows/`, `tasks/`, `blocks/` and `deployments/` packages wrap it thinly.
"""

__version__ = "0.1.0"
