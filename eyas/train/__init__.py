"""EAGLE-3 drafter training: model, draft vocabulary, training-time test (and its dense
reference), metrics (acc_i, acceptance length τ), data, trainer, report, export.

Plain modules (no Prefect): the same code runs on a GPU host. Entry point:
``python -m eyas.train.run`` (see ``eyas/train/run.py``).
"""
