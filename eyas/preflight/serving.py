"""Check 6, serving: the target and the drafter the training check exported answer one
prompt, speculating with the recipe's settings; the drafter loads and the server reports its
accept length. This is the check that catches an export the server will not load before days
are spent.

With ``evaluate.serving`` set, the server is SGLang (``sglang_python -m sglang.launch_server``,
the command `eyas.evaluate.sglang_server` builds for the serving benchmark, with the first
setting of its grid), started here on the host's loopback and stopped afterwards whatever
happens. Without it the recipe evaluates with eyas's own speculative decoding
(`eyas.evaluate.speculate`), and so does this check; SGLang's loading of the export is then not
checked, and the check says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from eyas.evaluate.prompts import prompt_of_record
from eyas.evaluate.serving_config import ServingConfig
from eyas.evaluate.sglang_server import (
    LAUNCH_MODULE,
    LOOPBACK,
    ServerSpec,
    generate_body,
    server_args,
)
from eyas.preflight.result import CheckFailed, CheckResult
from eyas.proc import stop_group

NAME = "serving"
LOAD_FIX = ("the exported drafter does not load: check drafter/export/config.json (architectures "
            "LlamaForCausalLMEagle3, draft_vocab_size, eagle_config) and its weights (d2t, t2d); "
            "re-export it with this eyas and SGLang version")


def first_prompt(merged: Path) -> list[int]:
    """The prompt (tokens before the first supervised one) of the first usable record."""
    with open(merged) as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                ids = prompt_of_record(rec["input_ids"], rec["loss_mask"])
                if ids:
                    return ids
    raise CheckFailed(f"no record of {merged} has a prompt before its answer",
                      fix="rerun `eyas prepare`")


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (OSError, urllib.error.URLError):
        return 0, b""


def _tail(path: Path, n: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


@contextlib.contextmanager
def sglang_server(*, model_dir: Path, drafter: Path | None, cfg: ServingConfig,
                  timeout_s: float, trust_remote_code: bool = False,
                  gpu_env: Mapping[str, str] | None = None) -> Iterator[SGLangSession]:
    """SGLang serving the target (with the drafter at `drafter`, speculating with the first
    setting of ``cfg``'s grid; None: the target alone) on the host's loopback, stopped on
    leaving whatever happens. `CheckFailed` when it exits or does not answer in `timeout_s`."""
    knobs = cfg.spec_grid()[0] if drafter is not None else None
    spec = ServerSpec(model_path=str(model_dir), port=cfg.port, tp_size=cfg.tp_size,
                      draft_model_path=str(drafter) if drafter is not None else None,
                      knobs=knobs, trust_remote_code=trust_remote_code,
                      extra_args=tuple(cfg.extra_server_args),
                      rejection_sampling=cfg.rejection_sampling and knobs is not None)
    base = f"http://{LOOPBACK}:{cfg.port}"
    what = (f"{model_dir} with the drafter {drafter} ({knobs.label()})" if knobs is not None
            else f"{model_dir} alone")
    if _get(base + "/health", 2)[0]:
        raise CheckFailed(f"port {cfg.port} on {LOOPBACK} is taken already (another server?)",
                          fix="stop that server, or set evaluate.serving.port to a free port")
    env = {**os.environ, **cfg.server_env, **(gpu_env or {})}
    log = Path(tempfile.mkstemp(prefix="eyas-preflight-sglang-", suffix=".log")[1])
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen([cfg.sglang_python, "-m", LAUNCH_MODULE, *server_args(spec)],
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise CheckFailed(f"SGLang exited ({proc.returncode}) before it answered, serving "
                                  f"{what}. Its log ends with:\n{_tail(log)}", fix=LOAD_FIX)
            if _get(base + cfg.health_path, 30)[0] == 200:
                break
            if time.monotonic() - t0 > timeout_s:
                raise CheckFailed(f"SGLang did not answer {cfg.health_path} within {timeout_s:g}s."
                                  f" Its log ends with:\n{_tail(log)}",
                                  fix="raise preflight.check_timeout_s if it is still loading; "
                                      "else see the log")
            time.sleep(1.0)
        yield SGLangSession(base, log, time.monotonic() - t0,
                            deadline=t0 + max(timeout_s, time.monotonic() - t0 + 30.0))
    finally:
        stop_group(proc, grace_s=30.0)


class SGLangSession:
    """A started SGLang server: `ask` one prompt, read `server_accept_length`."""

    def __init__(self, base: str, log: Path, startup_s: float, *, deadline: float) -> None:
        self.base, self.log, self.startup_s, self.deadline = base, log, startup_s, deadline

    def ask(self, prompt: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
        """SGLang's answer (greedy) to `prompt`: its JSON, ``meta_info`` and ``output_ids``."""
        body = json.dumps(generate_body(list(prompt), max_tokens=max_new_tokens,
                                        temperature=0.0)).encode()
        req = urllib.request.Request(self.base + "/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=max(30.0, self.deadline - time.monotonic())) as r:
                return json.loads(r.read())
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise CheckFailed(f"SGLang did not answer the prompt: {exc}. Its log ends with:\n"
                              f"{_tail(self.log)}", fix="see the log") from None

    def server_accept_length(self) -> float | None:
        _, raw = _get(self.base + "/server_info", 30)
        try:
            return (json.loads(raw).get("internal_states") or [{}])[0].get(
                "avg_spec_accept_length")
        except ValueError:
            return None


def accept_length(meta: Mapping[str, Any]) -> float | None:
    """One answer's accept length from its ``meta_info`` (None: no speculation)."""
    accept = meta.get("spec_accept_length")
    if accept is None and meta.get("spec_verify_ct"):
        accept = meta["completion_tokens"] / meta["spec_verify_ct"]
    return accept


def check_sglang(*, model_dir: Path, drafter: Path, prompt: list[int], cfg: ServingConfig,
                 max_new_tokens: int, timeout_s: float, trust_remote_code: bool = False,
                 gpu_env: Mapping[str, str] | None = None) -> CheckResult:
    """Serve the target with the drafter through SGLang, ask one prompt, read the accept length."""
    knobs = cfg.spec_grid()[0]
    with sglang_server(model_dir=model_dir, drafter=drafter, cfg=cfg, timeout_s=timeout_s,
                       trust_remote_code=trust_remote_code, gpu_env=gpu_env) as server:
        answer = server.ask(prompt, max_new_tokens)
        meta = answer.get("meta_info", {})
        accept = accept_length(meta)
        accept = accept if accept is not None else server.server_accept_length()
        startup = server.startup_s
    if accept is None:
        raise CheckFailed("SGLang answered but reported no accept length: it did not speculate "
                          "with the drafter", fix="check --speculative-algorithm EAGLE3 reaches "
                          "the server (evaluate.serving.extra_server_args must not override it)")
    return CheckResult(NAME, True,
                       f"SGLang ({knobs.label()}) loaded the drafter in {startup:,.0f}s and "
                       f"answered {meta.get('completion_tokens')} tokens; accept length "
                       f"{accept:.2f}", figure=f"accept length {accept:.2f}",
                       data={"accept_length": accept})


def sglang_answers(*, model_dir: Path, drafter: Path | None, prompts: Sequence[Sequence[int]],
                   cfg: ServingConfig, max_new_tokens: int, timeout_s: float,
                   trust_remote_code: bool = False, gpu_env: Mapping[str, str] | None = None
                   ) -> tuple[list[list[int]], float | None, list[dict[str, Any]]]:
    """SGLang's greedy answers to `prompts` (one server for all of them), the accept length
    over all of them (Σ completion tokens / Σ verifications; None without a drafter) and one
    ``{"prompt", "tokens", "accept_length"}`` per prompt."""
    answers, rows = [], []
    tokens = verifies = 0
    with sglang_server(model_dir=model_dir, drafter=drafter, cfg=cfg, timeout_s=timeout_s,
                       trust_remote_code=trust_remote_code, gpu_env=gpu_env) as server:
        for i, p in enumerate(prompts):
            answer = server.ask(p, max_new_tokens)
            meta = answer.get("meta_info", {})
            ids = list(answer.get("output_ids") or [])
            answers.append(ids)
            al = accept_length(meta)
            rows.append({"prompt": f"overfit-{i}", "tokens": len(ids), "accept_length": al})
            if meta.get("spec_verify_ct"):
                tokens += int(meta.get("completion_tokens") or 0)
                verifies += int(meta["spec_verify_ct"])
        overall = tokens / verifies if verifies else None
        if drafter is not None and overall is None:
            overall = server.server_accept_length()
    return answers, overall, rows


def check_eyas_speculation(*, model_dir: Path, drafter: Path, prompt: list[int], device: str,
                           draft_tokens: int, max_new_tokens: int,
                           trust_remote_code: bool = False) -> CheckResult:
    """Serve one prompt with eyas's own speculative decoding (the recipe has no SGLang)."""
    import torch

    from eyas.devices import resolve_device
    from eyas.errors import EyasError
    from eyas.evaluate.drafters import EagleDrafter, load_drafter
    from eyas.evaluate.speculate import generate
    from eyas.evaluate.target import Target, load_target, resolve_dtype
    from eyas.io import read_json

    dev = resolve_device(device)
    model = load_target(model_dir, dev, resolve_dtype("auto", dev),
                        trust_remote_code=trust_remote_code)
    raw = read_json(Path(model_dir) / "config.json")
    target_config = raw.get("text_config", raw)
    arch = (raw.get("architectures") or [None])[0]
    embed = model.get_input_embeddings().weight.detach().float().cpu()
    try:
        net, vocab, layers = load_drafter(drafter, embed, target_config=target_config,
                                          architecture=arch)
    except (EyasError, OSError, KeyError, RuntimeError, ValueError) as exc:
        raise CheckFailed(f"the drafter at {drafter} does not load: {exc}", fix=LOAD_FIX) from None
    if layers is None:
        raise CheckFailed(f"{drafter} does not record its auxiliary layers", fix=LOAD_FIX)
    dtype = next(model.parameters()).dtype
    method = EagleDrafter(net.to(dev, dtype), vocab)
    gen = generate(Target(model, layers), method, prompt, max_new_tokens=max_new_tokens,
                   draft_tokens=draft_tokens, generator=torch.Generator().manual_seed(0))
    accept = sum(gen.accept_lengths) / max(1, len(gen.accept_lengths))
    return CheckResult(NAME, True,
                       f"eyas's speculative decoding ({draft_tokens} draft tokens) loaded the "
                       f"drafter and answered {len(gen.tokens)} tokens; accept length {accept:.2f}",
                       figure=f"accept length {accept:.2f}",
                       partial="no SGLang in this recipe (evaluate.serving unset): SGLang's "
                               "loading of the export not checked",
                       data={"accept_length": accept})


def check_serving(*, model_dir: Path, drafter: Path | None, merged: Path,
                  serving: ServingConfig | None, device: str, draft_tokens: int,
                  max_new_tokens: int, timeout_s: float, trust_remote_code: bool = False,
                  gpu_env: Mapping[str, str] | None = None) -> CheckResult:
    """Check 6 with the drafter at `drafter` (None: the training check failed)."""
    if drafter is None or not Path(drafter).is_dir():
        raise CheckFailed("not run: no short-trained drafter to serve (the training check "
                          "failed)", fix="fix the training check first")
    prompt = first_prompt(merged)
    kw: dict[str, Any] = dict(model_dir=model_dir, drafter=Path(drafter), prompt=prompt,
                              max_new_tokens=max_new_tokens, trust_remote_code=trust_remote_code)
    if serving is not None:
        return check_sglang(cfg=serving, timeout_s=timeout_s, gpu_env=gpu_env, **kw)
    return check_eyas_speculation(device=device, draft_tokens=draft_tokens, **kw)
