"""The one SGLang release eyas is written against: its one pin (pyproject's `sglang` extra
installs it; a test holds the two equal).

The serving commands (`eyas.evaluate.sglang_server`), the argument table (`eyas.sglang_args`),
the extraction backend (`eyas.extract.sglang_backend`) and the hook SGLang loads in its own
processes (`eyas.extract.sglang_hook`) all read it: flags, the forward-hook interface and the
logits processor's call shape all moved between SGLang releases.
"""

from __future__ import annotations

from eyas.errors import EyasError

SGLANG_VERSION = "0.5.23"
"""The one SGLang release accepted (eyas's ``sglang`` extra pins it)."""


def check_sglang_version(version: str) -> None:
    """Refuse any SGLang but the one this backend was written against (EyasError)."""
    if version != SGLANG_VERSION:
        raise EyasError(
            f"eyas's SGLang backend was written against SGLang {SGLANG_VERSION} (its capture "
            f"flags, forward-hook interface and logits-processor call shape), found SGLang "
            f"{version}; install sglang=={SGLANG_VERSION} in the GPU host's eyas environment "
            f"(`ship(host, extras=['sglang'])` from the control machine, or `pip install "
            f"'<eyas checkout>[sglang]'` there) or use extract.backend: hf")
