"""recipes/kimi-k2.5.yaml, the users' real run: it validates, says what the users' notes say,
and `eyas extract --plan` prints its disk estimate for their merged set."""

import json

import yaml
from support.extract_fixtures import llama8, write_merged  # noqa: F401
from support.paths import REPO

from eyas.cli import main
from eyas.config import load_config
from eyas.extract.plan import bytes_per_token
from eyas.layers import check_sglang_capturable, to_input_of_layer_ids

RECIPE = REPO / "recipes" / "kimi-k2.5.yaml"
USERS = ["A1_deepswekimi", "A2_kimik25", "B1_glaive", "B2_opencodeinstruct", "B3_magicoder",
         "B4_mixturethoughts", "B5_openthoughts", "B6_ultrachat", "B7_sharegpt", "B8_sweagent"]
RECORDS, TOKENS, KIMI_H = 24_773, 87_800_000, 7168


def test_check_config_passes(capsys):
    assert main(["check-config", "--config", str(RECIPE)]) == 0
    out = capsys.readouterr().out
    assert "OK (10 datasets" in out and "A1_deepswekimi" not in out


def test_recipe_is_the_users_run():
    cfg = load_config(RECIPE)
    assert [d.name for d in cfg.datasets] == USERS
    assert cfg.merge.exclude == ["A1_deepswekimi"]
    assert cfg.merged_datasets() == USERS[1:]
    assert all(d.source.startswith("/data/") for d in cfg.datasets)
    assert cfg.merge.max_seq_len == 8192 == cfg.train.max_len
    assert cfg.target.trust_remote_code is True
    x = cfg.extract
    assert (x.backend, x.tp_size, x.aux_layers) == ("sglang", 8, [1, 29, 57])
    assert to_input_of_layer_ids(x.aux_layers) == [2, 30, 58]  # the users' numbering
    # what SGLang is given for Kimi-K2.5's class (DeepSeek rule: it adds the 1 itself)
    assert check_sglang_capturable(x.aux_layers, 61, "KimiK25ForConditionalGeneration") == [1, 29, 57]
    # the engine settings of the runbook's memory arithmetic (8 x 96 GB, TP 8)
    assert x.engine_args == {"mem_fraction_static": 0.85, "chunked_prefill_size": 8192,
                             "context_length": 9216, "max_running_requests": 128}
    assert x.engine_args["context_length"] > cfg.merge.max_seq_len  # + the generated token
    raw = RECIPE.read_text()
    assert "A1_deepswekimi is the outlier" in raw  # the reason sits beside the exclusion
    assert "GpuHost block named" in raw


def test_run_timeout_covers_the_slowest_server_the_baseline_at_batch_1():
    """The run deadline is sized from the slowest run of the benchmark -- the target alone at
    batch 1 (one request at a time at the users' ~90 tok/s), not a speculative server: every
    answer at max_tokens, one after the other, still ends within it."""
    s = load_config(RECIPE).evaluate.serving
    assert min(s.batch_sizes) == 1
    baseline_tok_s = 90.0
    slowest_s = s.num_prompts * s.max_tokens / baseline_tok_s
    assert round(slowest_s) == 2913
    assert s.run_timeout_s >= 1.2 * slowest_s


def test_recipe_samples_as_kimi_is_served_and_rejects_bad_records_up_to_a_share():
    """Thinking-mode sampling (Moonshot: temperature 1.0, top_p 0.95), one bad sample in 100K
    rejected rather than fatal, and the runbook's server started with both of Kimi's parsers
    (without them answers spell </think> and tool-call markers, which phase 1 refuses)."""
    cfg = load_config(RECIPE)
    assert (cfg.generation.temperature, cfg.generation.top_p) == (1.0, 0.95)
    assert (cfg.tokenize.on_bad_record, cfg.tokenize.max_rejected_share) == ("reject", 0.01)
    runbook = (REPO / "docs" / "runbook-kimi.md").read_text(encoding="utf-8")
    server = runbook[runbook.index("sglang.launch_server"):]
    server = server[: server.index(" &")]
    assert "--reasoning-parser kimi_k2" in server and "--tool-call-parser kimi_k2" in server


def test_plan_prints_the_disk_estimate_for_the_users_merged_set(capsys):
    cfg = load_config(RECIPE)
    per_token = bytes_per_token(KIMI_H, "final")
    assert per_token == 8 * KIMI_H + 5 == 57_349
    shards = -(-RECORDS // cfg.extract.shard_size)
    expected = TOKENS * per_token + 8 * (RECORDS + shards) + 1024 * shards
    args = ["extract", "--config", str(RECIPE), "--plan", "--records", str(RECORDS),
            "--tokens", str(TOKENS), "--hidden-size", str(KIMI_H)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{RECORDS:,} records, {TOKENS:,} tokens, hidden size 7168, {shards} shards" in out
    assert f"57,349 bytes/token -> 5.04 TB ({expected:,} bytes)" in out
    assert "(+10% margin): 5.54 TB" in out
    assert "compact 1.91 TB" in out and "SpecForge (8·H) 5.03 TB" in out
    assert main([*args, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["estimated_bytes"] == expected and est["shards"] == shards == 388
    assert est["required_bytes"] < 12e12  # fits the users' 12 TB volume with the margin
    assert "5.04 TB" in RECIPE.read_text()  # the estimate written beside the storage


def test_plan_from_merged_data_and_the_targets_config(tmp_path, llama8, capsys):  # noqa: F811
    raw = yaml.safe_load(RECIPE.read_text())
    raw["target"]["model"] = str(llama8)
    config = tmp_path / "kimi-like.yaml"
    config.write_text(yaml.safe_dump(raw))
    write_merged(tmp_path / "run" / "merged" / "train.jsonl", 70, max_len=30)
    write_merged(tmp_path / "run" / "merged" / "eval.jsonl", 3, seed=1, max_len=30)
    assert main(["extract", "--config", str(config), "--plan", "--workdir",
                 str(tmp_path / "run"), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    lengths = [len(json.loads(line)["input_ids"]) for split in ("train", "eval")
               for line in (tmp_path / "run" / "merged" / f"{split}.jsonl").read_text().splitlines()]
    assert (est["records"], est["tokens"], est["hidden_size"]) == (73, sum(lengths), 64)
    assert est["shards"] == 2  # ceil(73 / 64)
    assert main(["extract", "--config", str(RECIPE), "--plan"]) == 2
    assert "--records and --tokens" in capsys.readouterr().err


def test_plan_without_a_readable_target_asks_for_the_hidden_size(capsys):
    assert main(["extract", "--config", str(RECIPE), "--plan", "--records", "10",
                 "--tokens", "100"]) == 2
    assert "pass --hidden-size (7168 for Kimi-K2.5)" in capsys.readouterr().err


def test_the_runbooks_100k_figures(capsys):
    """docs/runbook-kimi.md: 100K samples at the users' mean length (87.8M / 24,773 tokens per
    record) need 20.33 TB in `final` -- more than the 12 TB volume -- and 7.70 TB in `compact`
    (8.47 TB with the margin), which fits."""
    tokens = int(round(100_000 * TOKENS / RECORDS, -4))
    assert tokens == 354_420_000
    args = ["extract", "--config", str(RECIPE), "--plan", "--records", "100000",
            "--tokens", str(tokens), "--hidden-size", str(KIMI_H), "--json"]
    assert main(args) == 0
    est = json.loads(capsys.readouterr().out)
    assert round(est["by_storage"]["final"] / 1e12, 2) == 20.33 and est["required_bytes"] > 12e12
    assert round(est["by_storage"]["topk"] / 1e12, 2) == 15.31
    compact = est["by_storage"]["compact"]
    assert round(compact / 1e12, 2) == 7.70 and round(compact * 1.1 / 1e12, 2) == 8.47
    runbook = (REPO / "docs" / "runbook-kimi.md").read_text()
    assert all(f in runbook for f in ("20.33 TB", "15.31 TB", "7.70 TB", "8.47 TB", "354M"))
