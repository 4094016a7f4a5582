"""``python -m eyas.tiny``: build (or find) the cached tiny target; optionally write demo data.

Examples::

    python -m eyas.tiny                      # prints the model folder, building it if needed
    python -m eyas.tiny --force              # rebuild it
    python -m eyas.tiny --demo-data ./demo   # also write the demo datasets into ./demo
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m eyas.tiny", description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--demo-data", type=Path, help="also write the demo datasets here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    from eyas.tiny.build import build_tiny_target, read_build_info
    from eyas.tiny.demo_data import write_demo_datasets

    folder = build_tiny_target(force=args.force)
    print(folder)
    print(json.dumps(read_build_info(folder)["stats"], indent=2, sort_keys=True))
    if args.demo_data:
        for name, path in write_demo_datasets(args.demo_data).items():
            print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
