"""``python -m eyas.tiny``: build (or find) the cached tiny target; optionally write demo data.

Prints the model folder, its training stats and how varied its answers to the demo prompts
are (distinct-2, repeat rate; measured when the weights were trained). Examples::

    python -m eyas.tiny                      # prints the model folder, building it if needed
    python -m eyas.tiny --force              # rebuild it
    python -m eyas.tiny --measure            # measure the answers again, on this machine
    python -m eyas.tiny --demo-data ./demo   # also write the demo datasets into ./demo

Retraining the shipped weights is ``python -m eyas.tiny.weights`` (hours).
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
    parser.add_argument("--measure", action="store_true", help="answer the demo prompts now")
    parser.add_argument("--demo-data", type=Path, help="also write the demo datasets here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    from eyas.tiny.build import build_tiny_target, read_build_info
    from eyas.tiny.demo_data import write_demo_datasets

    folder = build_tiny_target(force=args.force)
    info = read_build_info(folder)
    print(folder)
    print(json.dumps(info["stats"], indent=2, sort_keys=True))
    answers = info["answers"]
    if args.measure:
        from eyas.tiny.answers import answer_stats

        answers = answer_stats(folder)
    print(
        f"answers to {answers['answers']} demo prompts: distinct-2 {answers['distinct_2']:.3f}, "
        f"repeat rate {answers['repeat_rate']:.3f}, on topic {answers['on_topic_share']:.2f}, "
        f"ended {answers['ended_share']:.2f}, {answers['mean_words']} words on average"
    )
    for example in answers["examples"]:
        print(f"  Q: {example['prompt']}\n  A: {example['answer']}")
    if args.demo_data:
        for name, path in write_demo_datasets(args.demo_data).items():
            print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
