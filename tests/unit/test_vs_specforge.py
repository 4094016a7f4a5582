"""benchmarks/vs_specforge.py scores the two trainers' drafters by real drafting (the target
verifies, `eyas.evaluate`) beside the simulated acceptance: its scoring functions on the tiny
target, without SpecForge (the training side needs SpecForge's own venv)."""

from __future__ import annotations

import json

import pytest
import torch
from support.paths import REPO
from support.repo_scripts import load_module


@pytest.fixture(scope="module")
def bench():
    return load_module(REPO / "benchmarks" / "vs_specforge.py")


def test_real_drafting_scores_both_drafters_with_paired_intervals(bench, tiny_target, tmp_path):
    from support.evaluate_fixtures import export_random_drafter

    from eyas.evaluate.speculate import generate
    from eyas.evaluate.target import Target, load_target
    from eyas.extract.target import load_target_embeddings
    from eyas.train.export import load_exported
    from eyas.train.tiny_data import tiny_records, write_jsonl

    torch.set_num_threads(1)
    embed = load_target_embeddings(tiny_target).float()
    a, vocab, layers = load_exported(export_random_drafter(tiny_target, tmp_path / "a", seed=1),
                                     embed)
    b, _, _ = load_exported(export_random_drafter(tiny_target, tmp_path / "b", seed=2), embed)
    merged = tmp_path / "merged"
    write_jsonl(merged / "train.jsonl", tiny_records(tiny_target, 2))
    write_jsonl(merged / "eval.jsonl", tiny_records(tiny_target, 2)
                + tiny_records(tiny_target, 3, heldout=True))
    prompts = bench.heldout_prompts(merged, 3)
    assert len(prompts) == 3  # the two training prompts are left out
    target = Target(load_target(tiny_target, torch.device("cpu"), torch.float32), layers)
    real = {name: [bench.real_drafting_counts(d, vocab, target, prompts, k=3, max_new_tokens=8)]
            for name, d in (("eyas", a), ("specforge", b))}
    for lengths in real["eyas"][0]:
        assert lengths and all(1 <= x <= 4 for x in lengths) and sum(lengths) <= 8 - 1
    # The same decoding the evaluator runs: the kept tokens are the target's greedy output.
    from eyas.evaluate.drafters import EagleDrafter
    g = generate(target, EagleDrafter(a, vocab), prompts[0], max_new_tokens=8, draft_tokens=3)
    assert g.accept_lengths == real["eyas"][0][0]
    out = bench.real_summary(real, 200)
    for name in ("eyas", "specforge"):
        lo, hi = out[name]["ci95"]
        assert lo <= out[name]["tau"] <= hi and out[name]["tau_per_seed"] == [out[name]["tau"]]
    assert out["difference"]["of"] == "eyas - specforge"
    assert out["difference"]["verdict"] in ("ahead", "behind", "within noise")
    json.dumps(out)  # goes into the benchmark's last line
    same = bench.real_summary({"eyas": real["eyas"], "specforge": real["eyas"]}, 200)
    assert same["difference"]["tau"] == 0 and same["difference"]["ci95"] == [0.0, 0.0]
    assert same["difference"]["verdict"] == "within noise"


def test_overrides_name_the_flag_and_the_fields_it_takes(bench):
    assert bench.parse_overrides(["lr=0.001", "betas=[0.9, 0.999]"]) == {
        "lr": 0.001, "betas": [0.9, 0.999]}
    sf = bench.parse_overrides(["lr=2e-3"], flag="--specforge-set",
                               allowed=bench.SPECFORGE_FIELDS)
    assert bench.TrainConfig.model_validate(sf).lr == 0.002  # YAML's "2e-3" is a string
    # SpecForge's run YAML has no field for eyas's own choices: refused, naming what it takes
    with pytest.raises(SystemExit, match=r"--specforge-set 'init_head=target'.*lr"):
        bench.parse_overrides(["init_head=target"], flag="--specforge-set",
                              allowed=bench.SPECFORGE_FIELDS)
    with pytest.raises(SystemExit, match=r"--eyas-set 'lr'"):
        bench.parse_overrides(["lr"])


def test_relative_run_folders_reach_specforge_as_absolute_paths(bench, tmp_path, monkeypatch):
    # SpecForge's trainer runs with its work folder as cwd: a relative --workdir once handed it
    # a config path it could not open ("No such file or directory: 'runs/.../vs-eyas-seed0.yaml'")
    monkeypatch.chdir(tmp_path)
    args = bench.parse_args(["--workdir", "runs/smollm2", "--recipe", "r.yaml"])
    assert args.workdir == tmp_path / "runs" / "smollm2" and args.workdir.is_absolute()
    assert args.recipe == tmp_path / "r.yaml"


def test_scores_are_keyed_by_the_evaluating_functions_not_the_whole_harness(bench):
    one = bench.code_hash(bench.per_sample_counts)
    assert one == bench.code_hash(bench.per_sample_counts) and len(one) == 16
    assert one != bench.code_hash(bench.real_drafting_counts)
    assert one != bench.code_hash(bench.per_sample_counts, bench.ROOT / "eyas" / "train" / "ttt.py")


@pytest.mark.parametrize("rule", ["target_only", "rejection"])
def test_sampled_acceptance_is_the_probability_the_verifier_accepts(bench, rule):
    """The simulated acceptance of one draft equals how often `eyas.evaluate.speculate.verify`
    (the real drafting's verifier) accepts it: 20,000 draws, within 4.5 standard errors."""
    from eyas.evaluate.drafters import Proposal
    from eyas.evaluate.speculate import Sampling, verify
    from eyas.train.vocab import DraftVocab

    g = torch.Generator().manual_seed(3)
    vocab = DraftVocab(torch.tensor([0, 2, 3, 5, 7, 8, 10, 11]), 12)  # 4 tokens never drafted
    target_V = torch.randn(12, generator=g, dtype=torch.float64) * 1.5
    draft_Vd = target_V[vocab.draft_to_target] + torch.randn(8, generator=g, dtype=torch.float64)
    temp = 0.7
    logp = bench.target_logp(target_V[None], vocab, temp)
    alpha = bench.sampled_acceptance(draft_Vd[None], logp, temp)[0]
    expected = float(alpha[bench.RULES.index(rule)])
    q_Vd = torch.softmax(draft_Vd / temp, dim=-1)
    q_V = torch.zeros(12, dtype=torch.float64)
    q_V[vocab.draft_to_target] = q_Vd
    sampling = Sampling(temp, rule=rule)
    logits = torch.stack([target_V, target_V])  # rows after y and after the draft
    n, hits = 20_000, 0
    for _ in range(n):
        d = int(q_Vd.argmax()) if rule == "target_only" else int(torch.multinomial(q_Vd, 1,
                                                                                   generator=g))
        proposal = Proposal([int(vocab.draft_to_target[d])], q_V[None])
        hits += verify(logits, proposal, sampling, g)[0]
    se = (expected * (1 - expected) / n) ** 0.5
    assert 0.05 < expected < 0.95 and abs(hits / n - expected) < 4.5 * se
    # the rejection rule's α is Σ min(p, q): 1 only when q is p (and p has no mass outside)
    p_V = torch.softmax(target_V / temp, dim=-1)
    assert float(alpha[1]) == pytest.approx(float(torch.minimum(p_V[vocab.draft_to_target],
                                                                q_Vd).sum()))


def test_simulated_sampled_acceptance_cools_to_the_greedy_count(bench, tiny_target, tmp_path):
    """At a temperature near 0 the simulated target_only acceptance of each sample and step is
    the greedy evaluator's argmax match: the two score the same positions against the same
    teacher rows. Warmer, the rejection rule's α is a probability at every position."""
    from eyas.extract.target import load_target_embeddings, load_target_lm_head
    from eyas.io import read_json
    from eyas.train.data import OfflineSource
    from eyas.train.model import Drafter, DrafterConfig
    from eyas.train.tiny_data import extract_shards, tiny_records, write_jsonl
    from eyas.train.vocab import load_or_build

    torch.set_num_threads(1)
    torch.manual_seed(0)
    jsonl = write_jsonl(tmp_path / "train.jsonl", tiny_records(tiny_target, 3))
    src = OfflineSource(extract_shards(tiny_target, jsonl, tmp_path / "hidden", storage="final",
                                       shard_size=3))
    config = read_json(tiny_target / "config.json")
    embed = load_target_embeddings(tiny_target).float()
    head = load_target_lm_head(tiny_target).float()
    V = int(config["vocab_size"])
    vocab, _ = load_or_build(tmp_path / "vocab", src.identity(), 48, V, src.masked_tokens())
    drafter = Drafter(DrafterConfig.from_target(config, vocab.size), embed)
    # a drafter that often agrees with the target: its head is the target's (draft rows)
    with torch.no_grad():
        drafter.lm_head.weight.copy_(head[vocab.draft_to_target])
    correct, total = bench.per_sample_counts(drafter, vocab, head, src, max_len=None, steps=3)
    alpha, total2 = bench.per_sample_sampled(drafter, vocab, head, src, max_len=None, steps=3,
                                             temperatures=[1e-4, 1.0])
    assert alpha.shape == (3, 2, len(bench.RULES), 3) and torch.equal(total2, total)
    assert int(correct.sum()) > 0  # the comparison below is not one of zeros
    torch.testing.assert_close(alpha[:, 0, 0], correct.double(), atol=1e-6, rtol=0)
    warm = alpha[:, 1]
    assert bool((warm >= 0).all()) and bool((warm <= total[:, None, :] + 1e-9).all())
    assert 0 < float(warm.sum()) < float(total.sum() * len(bench.RULES))


def test_real_sampled_drafting_repeats_for_the_same_drafter(bench, tiny_target, tmp_path):
    """Sampled real drafting draws each prompt's randomness from its own seed: the same drafter
    gives the same accept lengths twice, each within 1..k+1."""
    from support.evaluate_fixtures import export_random_drafter

    from eyas.evaluate.target import Target, load_target
    from eyas.extract.target import load_target_embeddings
    from eyas.train.export import load_exported
    from eyas.train.tiny_data import tiny_records, write_jsonl

    torch.set_num_threads(1)
    embed = load_target_embeddings(tiny_target).float()
    d, vocab, layers = load_exported(export_random_drafter(tiny_target, tmp_path / "a", seed=1),
                                     embed)
    merged = tmp_path / "merged"
    write_jsonl(merged / "train.jsonl", tiny_records(tiny_target, 1))
    write_jsonl(merged / "eval.jsonl", tiny_records(tiny_target, 2, heldout=True))
    prompts = bench.heldout_prompts(merged, 2)
    target = Target(load_target(tiny_target, torch.device("cpu"), torch.float32), layers)
    for rule in bench.RULES:
        runs = [bench.real_sampled_counts(d, vocab, target, prompts, k=3, max_new_tokens=8,
                                          temperature=1.0, rule=rule) for _ in range(2)]
        assert runs[0] == runs[1] and len(runs[0]) == 2
        assert all(1 <= x <= 4 for lengths in runs[0] for x in lengths)


def test_eyas_storage_extracts_the_same_train_samples_again_in_that_storage(bench, tiny_target,
                                                                            tmp_path):
    """`--eyas-storage compact`: eyas's train split is the same samples, extracted again as
    float8 aux states + the top-K teacher; SpecForge's and the scored splits stay "final"."""
    from eyas.manifest import write_manifest
    from eyas.train.data import OfflineSource
    from eyas.train.tiny_data import tiny_records, write_jsonl

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "name: storage-row\ntarget:\n  model: eyas:tiny\n"
        "merge:\n  max_seq_len: 1024\n  eval_fraction: 0.5\n  seed: 1\n"
        "extract:\n  topk: 8\n  shard_size: 4\n"
        "datasets:\n  - name: qa\n    source: eyas:demo/demo_sharegpt.jsonl\n"
        "    format: sharegpt\n    regenerate: false\n")
    workdir = tmp_path / "run"
    tokenized = write_jsonl(workdir / "prepared" / "qa" / "tokenized_data.jsonl",
                            tiny_records(tiny_target, 8))
    write_manifest(tokenized.parent, phase="tokenize", outputs=[tokenized])

    data = bench.prepare_data(recipe, workdir, 0.5, "compact")
    final, compact = OfflineSource(data["train"]), OfflineSource(data["eyas_train"])
    assert data["eyas_train"] != data["train"] and compact.storage == "compact"
    assert final.storage == OfflineSource(data["eval"]).storage == "final"
    assert compact.ids == final.ids and len(final) > 0
    assert compact.identity() != final.identity()  # eyas's training is keyed by its own data
    assert bench.folder_bytes(data["eyas_train"]) < bench.folder_bytes(data["train"])
    # the default adds nothing: eyas trains on the "final" split, as before the flag
    again = bench.prepare_data(recipe, workdir, 0.5)
    assert again["eyas_train"] == again["train"] == data["train"]


def test_data_fingerprint_names_the_merged_splits_content(bench, tmp_path):
    """Study rows run in different sessions compare only on the same data: the harness prints
    (and writes in its last line) each merged split's SHA-256, which a changed split changes."""
    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "train.jsonl").write_text('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n')
    (merged / "eval.jsonl").write_text('{"input_ids": [3, 4], "loss_mask": [0, 1]}\n')
    first = bench.data_fingerprint(merged)
    assert sorted(first) == ["eval", "train"]
    assert all(len(v) == 16 and int(v, 16) >= 0 for v in first.values())
    assert first["train"] != first["eval"]
    assert bench.data_fingerprint(merged) == first
    (merged / "eval.jsonl").write_text('{"input_ids": [3, 5], "loss_mask": [0, 1]}\n')
    second = bench.data_fingerprint(merged)
    assert second["train"] == first["train"] and second["eval"] != first["eval"]


def test_concurrent_runs_prepare_the_shared_files_one_at_a_time(bench, tmp_path, capsys):
    """Runs of several seeds started together (`--only specforge --seeds N` each) share the
    data, SpecForge's features and vocabulary mapping: the second waits for the first's setup,
    and says so, rather than rewriting a file the first is reading."""
    import threading

    order = []
    entered = threading.Event()

    def second():
        with bench.setup_lock(tmp_path / "run"):
            order.append("second")

    with bench.setup_lock(tmp_path / "run"):
        t = threading.Thread(target=second)
        t.start()
        # the second blocks in flock once it has said it waits
        for _ in range(200):
            if "waiting for another vs_specforge run" in capsys.readouterr().out:
                entered.set()
                break
            t.join(0.05)
        assert entered.is_set() and t.is_alive() and order == []
        order.append("first")
    t.join(10)
    assert order == ["first", "second"]
    assert (tmp_path / "run" / bench.SETUP_LOCK).is_file()


def test_a_prompt_file_is_a_real_drafting_set_rendered_as_phase_6_renders_it(bench, tiny_target,
                                                                          tmp_path):
    """`--real-prompt-file` (HumanEval's shape here, gzip JSONL of task_id + prompt) gives its
    first N prompts in the target's chat template, named by the file, as phase 6 reads them."""
    import gzip

    from eyas.evaluate.prompts import render_ids
    from eyas.prepare.tokenize import load_tokenizer

    rows = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    return x + {i}\n"}
            for i in range(3)]
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    label, prompts = bench.file_prompt_ids(str(path), tiny_target, 2)
    tok = load_tokenizer(tiny_target)
    assert label == "HumanEval"
    assert prompts == [tuple(render_ids(tok, [{"role": "user", "content": r["prompt"]}]))
                       for r in rows[:2]]
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"id": "a", "messages": []}) + "\n")
    with pytest.raises(SystemExit, match="no usable prompt"):
        bench.file_prompt_ids(str(empty), tiny_target, 2)


def test_progress_line_says_the_step_the_rate_and_the_time_left(bench):
    steps = [{"seconds": 2.0, "cpu_seconds": 2.0, "tokens": 1000}] * 25
    assert bench.progress_line("seed 0 eyas training", steps, 100) == \
        "seed 0 eyas training: step 25/100, 500 tok/s, ~2 min left"


def test_train_samples_trains_on_the_first_n_and_only_eyas(bench):
    from eyas.train.data import Batches, MemorySource

    samples = [{"input_ids": torch.arange(3 + i), "loss_mask": torch.ones(3 + i, dtype=torch.long),
                "aux_hidden": torch.zeros(3 + i, 6)} for i in range(5)]
    src = MemorySource(samples)
    first = bench.FirstSamples(src, 3)
    assert len(first) == 3 and first.ids == src.ids[:3] and first.lengths() == [3, 4, 5]
    assert first.identity() != bench.FirstSamples(src, 4).identity() != src.identity()
    with pytest.raises(IndexError):
        first.load(3)
    batches = Batches(first, micro_batch=2, seed=0, group_batches=2)  # reads lengths()
    one_epoch = [i for _ in range(batches.per_epoch) for i in next(batches).ids]
    assert sorted(one_epoch) == src.ids[:3]
    for n in (0, 6):
        with pytest.raises(SystemExit, match="holds 5 samples"):
            bench.FirstSamples(src, n)
    with pytest.raises(SystemExit):  # argparse: SpecForge's side has no subset
        bench.parse_args(["--train-samples", "2"])
    assert bench.parse_args(["--train-samples", "2", "--only", "eyas"]).train_samples == 2
