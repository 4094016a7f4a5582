"""Check 6 against the SGLang stand-in (stands in for SGLang 0.5.23's server, which needs a
GPU): the drafter loads and the accept length comes back; a drafter the server cannot load
fails the check naming the fix, without waiting for the time limit."""

import json
import socket
import sys
import time

import pytest
from support.serving_fixtures import STANDIN

from eyas.evaluate.serving_config import ServingConfig
from eyas.preflight.result import bounded
from eyas.preflight.serving import check_serving


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(STANDIN))
    merged = tmp_path / "train.jsonl"
    merged.write_text(json.dumps({"id": "a", "input_ids": [5, 6, 7, 8],
                                  "loss_mask": [0, 0, 1, 1]}) + "\n")
    drafter = tmp_path / "export"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    cfg = ServingConfig(sglang_python=sys.executable, port=_port(), batch_sizes=[1],
                        num_prompts=1, num_steps=[3])
    kw = dict(model_dir=tmp_path, merged=merged, serving=cfg, device="cpu", draft_tokens=3,
              max_new_tokens=16, timeout_s=120)
    return drafter, kw


@pytest.mark.timeout(200)
def test_sglang_stand_in_loads_the_drafter_and_reports_the_accept_length(served):
    drafter, kw = served
    r = check_serving(drafter=drafter, **kw)
    assert r.ok and "loaded the drafter" in r.detail
    assert r.data["accept_length"] == pytest.approx(16 / 6)  # stand-in: 1 + 0.6 x 3 per verify


@pytest.mark.timeout(200)
def test_a_drafter_sglang_cannot_load_fails_naming_the_fix(served):
    drafter, kw = served
    (drafter / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    t0 = time.monotonic()
    r = bounded("serving", lambda: check_serving(drafter=drafter, **kw), 150)
    assert time.monotonic() - t0 < 60  # the exit is seen at once, not at the limit
    assert not r.ok and "SGLang exited (1) before it answered" in r.detail
    assert "not an EAGLE-3 drafter" in r.detail
    assert "re-export it" in r.fix
    r = bounded("serving", lambda: check_serving(drafter=None, **kw), 30)
    assert not r.ok and "the training check failed" in r.detail
