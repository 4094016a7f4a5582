"""`eyas.hf.transformers_names`: the first import of transformers from several threads at once."""

from __future__ import annotations

import subprocess
import sys

# A fresh interpreter: the race is in transformers' first (lazy) import of a name.
RACE = """
import threading
from eyas.hf import transformers_names
errors = []
def load():
    try:
        transformers_names("AutoTokenizer", "AutoModelForCausalLM")
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=load) for _ in range(6)]
for t in threads: t.start()
for t in threads: t.join()
print(errors)
"""


def test_names_come_whole_to_threads_importing_them_first_at_once():
    """Plain ``from transformers import AutoTokenizer`` in 4 threads at once failed with
    ImportError in 3 runs of 3 here (the tokenize tasks of the demo hit it)."""
    out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
