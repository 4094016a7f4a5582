"""SGLang server command lines for the serving benchmark: the target alone, with SGLang's own
n-gram speculation, and with EAGLE-3.

    python -m sglang.launch_server --model-path M --host 127.0.0.1 --port P --tp-size N
        --incremental-streaming-output [--trust-remote-code]
        [--speculative-algorithm EAGLE3 --speculative-draft-model-path D
         --speculative-num-steps S --speculative-eagle-topk K --speculative-num-draft-tokens T]
        [--speculative-algorithm NGRAM [--speculative-num-draft-tokens T]
         [--speculative-ngram-* ...]]
        [extra args]

``--incremental-streaming-output`` on every server: SGLang 0.5.23 streams the whole answer so
far (text and ids) in every ``/generate`` event by default, which at 8,192-token answers and
batch 32 is gigabytes of JSON through its one tokenizer-manager process, and costs the
baseline (an event a token) more than EAGLE-3 (an event a verify step), inflating the speedup.
With it each event carries only its new ``text`` and ``output_ids``, while
``meta_info.completion_tokens`` (and ``spec_verify_ct``) stay the request's running totals
(``TokenizerManager._handle_batch_output``: ``recv_obj.completion_tokens``; queued chunks are
coalesced with the last chunk's ``meta_info``), which is what `eyas.evaluate.loadgen` reads.

N-gram speculation (``NGRAM``) drafts from a trie of the tokens already seen (CPU, no draft
model). SGLang 0.5.23's defaults for it (``arg_groups/speculative_hook.py``, ``_handle_ngram``;
``arg_groups/fields/spec.py``): 12 draft tokens, a BFS tree of breadth 1..10
(``--speculative-ngram-min-bfs-breadth`` / ``-max-bfs-breadth``, which also becomes its topk),
trie depth 18, capacity 10M, match type BFS, and ``--max-running-requests`` 48 when unset.

Flag names and value types are those of SGLang 0.5.23 (`PINNED_SGLANG`): the fields of
``sglang/srt/arg_groups/fields/{model,serving,parallel,spec}.py`` that its ``ServerArgs``
assembles (``--tp-size`` is also spelled ``--tensor-parallel-size`` there). Tests check the
command against SGLang's own parser where SGLang is importable and against these pinned shapes
elsewhere. The server listens on the host's loopback only: the load generator runs on the host.

What the benchmark reads back from a server (also pinned from 0.5.23):
- ``GET /health_generate``: 200 once a one-token generation went through, 503 while starting
  (``srt/entrypoints/http_server.py``);
- ``POST /generate`` with ``input_ids`` and ``sampling_params``: ``meta_info.completion_tokens``
  always, ``meta_info.spec_verify_ct`` (verification steps) when speculation ran; SGLang's own
  accept length is ``completion_tokens / spec_verify_ct`` (the bonus token counted;
  ``srt/managers/tokenizer_manager.py``, ``_calculate_spec_decoding_metrics``);
- ``GET /server_info``: ``internal_states[0].avg_spec_accept_length``, accepted tokens per
  verification since the server started (``scheduler_components/internal_state.py``);
- ``POST /flush_cache`` (GET too): empties the radix (prefix) cache; 200, or 400 while requests
  are running or waiting (``srt/entrypoints/http_server.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from eyas.evaluate.serving_config import SpecKnobs
from eyas.remote.hosts import shell_join
from eyas.sglang_version import SGLANG_VERSION

PINNED_SGLANG = SGLANG_VERSION
"""The SGLang release whose flags and HTTP shapes this module was written against: the one
pin (`eyas.sglang_version`)."""

LAUNCH_MODULE = "sglang.launch_server"
"""``python -m`` entry point of SGLang's HTTP server."""

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServerSpec:
    """One server of the benchmark: what it serves and how (plain data)."""

    model_path: str
    port: int
    tp_size: int = 1
    draft_model_path: str | None = None
    knobs: SpecKnobs | None = None
    trust_remote_code: bool = False
    extra_args: tuple[str, ...] = ()
    ngram: bool = False
    """SGLang's own n-gram speculation (no drafter; `ngram_args` are its flags)."""
    ngram_args: tuple[str, ...] = ()
    rejection_sampling: bool = False
    """``--speculative-use-rejection-sampling`` (an EAGLE-3 server only)."""

    @property
    def mode(self) -> str:
        """``baseline`` (no speculation), ``ngram`` (SGLang's n-gram speculation) or ``eagle3``."""
        return "ngram" if self.ngram else "baseline" if self.knobs is None else "eagle3"

    def __post_init__(self) -> None:
        if (self.knobs is None) != (self.draft_model_path is None):
            raise ValueError("an EAGLE-3 server needs both the drafter's path and its knobs")
        if self.ngram and self.knobs is not None:
            raise ValueError("a server speculates with n-grams or with EAGLE-3, not both")
        if self.ngram_args and not self.ngram:
            raise ValueError("n-gram flags given for a server without n-gram speculation")
        if self.rejection_sampling and self.knobs is None:
            raise ValueError("rejection sampling is a flag of an EAGLE-3 server only")


INCREMENTAL = "--incremental-streaming-output"
"""Every server eyas starts streams deltas (see the module docstring)."""


def server_args(spec: ServerSpec) -> list[str]:
    """SGLang's command-line arguments (after ``python -m sglang.launch_server``) for `spec`."""
    args = ["--model-path", spec.model_path, "--host", LOOPBACK, "--port", str(spec.port),
            "--tp-size", str(spec.tp_size), INCREMENTAL]
    if spec.trust_remote_code:
        args.append("--trust-remote-code")
    if spec.knobs is not None:
        args += [
            "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", str(spec.draft_model_path),
            "--speculative-num-steps", str(spec.knobs.num_steps),
            "--speculative-eagle-topk", str(spec.knobs.eagle_topk),
            "--speculative-num-draft-tokens", str(spec.knobs.num_draft_tokens),
        ]
        if spec.rejection_sampling:
            args.append("--speculative-use-rejection-sampling")
    if spec.ngram:
        args += ["--speculative-algorithm", "NGRAM", *spec.ngram_args]
    return args + list(spec.extra_args)


def server_command(python: str, spec: ServerSpec) -> str:
    """The shell command that starts the server for `spec` with `python` (SGLang's venv)."""
    argv = [python, "-m", LAUNCH_MODULE, *server_args(spec)]
    return shell_join(*argv)


def generate_body(input_ids: list[int], *, max_tokens: int, temperature: float,
                  stream: bool = False) -> dict:
    """A ``POST /generate`` body for one prompt given as token ids; with `stream` SGLang answers
    with server-sent events, ``data: {...}`` per step (``meta_info.completion_tokens`` counting
    every token so far) and ``data: [DONE]``."""
    body: dict = {"input_ids": list(input_ids),
                  "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature}}
    if stream:
        body["stream"] = True
    return body
