"""Check 5's own refusals (the run itself is covered end to end by test_flow)."""

from eyas.preflight.result import bounded
from eyas.preflight.training import check_training, short_config
from eyas.train.config import TrainConfig


def test_training_is_not_run_without_captured_samples(tmp_path):
    r = bounded("training", lambda: check_training(
        work=tmp_path, model_dir=tmp_path, cfg=TrainConfig(), steps=2, processes=1,
        aux_layers=None, timeout_s=30, records=10, tokens=100), 30)
    assert not r.ok and "the capture check failed" in r.detail and r.fix


def test_the_short_run_keeps_the_recipes_shape_and_length():
    cfg = TrainConfig(max_len=8192, micro_batch=1, epochs=2.0, warmup_steps=50,
                      intermediate_size=1024)
    short = short_config(cfg, 20, 8)
    assert (short.max_len, short.micro_batch, short.intermediate_size) == (8192, 1, 1024)
    assert (short.steps, short.epochs, short.processes, short.warmup_steps) == (20, None, 8, 19)
