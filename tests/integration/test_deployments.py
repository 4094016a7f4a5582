"""Deployments: typed parameters (a form in the UI), choices as lists, a schedule for any
deployment, the retry of failed shards without a person, and prefect.yaml kept current."""

from pathlib import Path

import pytest
import yaml
from support.paths import REPO

from eyas.config import PipelineConfig, load_config
from eyas.errors import ConfigError

RECIPE = REPO / "recipes" / "tiny-demo.yaml"


def test_every_deployment_takes_the_typed_config_prefilled_from_the_recipe(tmp_path,
                                                                          prefect_harness):
    from deployments.serve import DEPLOYMENTS, build_deployments

    deps = build_deployments(RECIPE, tmp_path, cron={"pipeline": "0 3 * * *",
                                                     "extract": "30 * * * *"})
    assert [d.name for d in deps] == list(DEPLOYMENTS)
    recipe = load_config(RECIPE)
    for dep in deps:
        assert set(dep.parameters) >= {"config", "workdir"}
        # The default is the recipe itself: the form opens filled in, and validates.
        assert PipelineConfig.model_validate(dep.parameters["config"]) == recipe.model_copy(
            update={"source_dir": None})
        schema = dep._parameter_openapi_schema.model_dump()
        assert schema["properties"]["config"]["$ref"] == "#/definitions/PipelineConfig"
        fields = schema["definitions"]["TrainConfig"]["properties"]
        assert "Peak AdamW learning rate." in fields["lr"]["description"]
        assert "source_dir" not in schema["definitions"]["PipelineConfig"]["properties"]
        assert set(dep.parameters) <= set(schema["properties"])
    by = {d.name: d for d in deps}
    assert by["pipeline"].schedules[0].schedule.cron == "0 3 * * *"
    assert by["extract"].schedules[0].schedule.cron == "30 * * * *"
    assert not by["train"].schedules
    assert by["extract-retry-failed"].parameters["only_failed"] is True


def test_choices_are_lists_and_the_host_a_block_picker(prefect_harness):
    from prefect.utilities.callables import parameter_schema

    from flows.extract import extract_hidden_states
    from flows.pipeline import run_pipeline
    from flows.prepare import prepare_data
    from flows.train import train_drafter_flow

    def props(flow):
        return parameter_schema(flow.fn).model_dump()

    pipe = props(run_pipeline)
    assert pipe["properties"]["phases"]["anyOf"][0]["items"]["enum"] == [
        "generate", "tokenize", "merge", "extract", "train", "evaluate"]
    assert pipe["properties"]["data"]["enum"] == ["offline", "online"]
    assert pipe["definitions"]["GpuHost"]["block_type_slug"] == "eyas-gpu-host"
    assert props(extract_hidden_states)["properties"]["splits"]["anyOf"][0]["items"]["enum"] == [
        "train", "eval"]
    assert props(train_drafter_flow)["properties"]["data"]["enum"] == ["offline", "online"]
    assert props(prepare_data)["properties"]["phases"]["anyOf"][0]["items"]["enum"] == [
        "generate", "tokenize", "merge"]


def test_cron_names_a_deployment():
    from deployments.serve import parse_crons

    assert parse_crons(["0 3 * * *"]) == {"prepare-data": "0 3 * * *"}
    assert parse_crons(["pipeline=0 3 * * *", "extract = 30 * * * *"]) == {
        "pipeline": "0 3 * * *", "extract": "30 * * * *"}
    with pytest.raises(ConfigError, match="no deployment 'nightly'"):
        parse_crons(["nightly=0 3 * * *"])


def test_failed_runs_are_retried_without_a_person(tmp_path, prefect_harness):
    from deployments.serve import AUTO_RETRY_TAG, build_deployments, retrying_pipeline

    deps = {d.name: d for d in build_deployments(RECIPE, tmp_path)}
    assert AUTO_RETRY_TAG in deps["extract"].tags
    assert AUTO_RETRY_TAG not in deps["extract-retry-failed"].tags  # retried once, no loop
    (trigger,) = deps["extract-retry-failed"].triggers
    assert trigger.expect == {"prefect.flow-run.Failed"}
    assert trigger.match_related.model_dump() == {"prefect.resource.role": "tag",
                                     "prefect.resource.id": f"prefect.tag.{AUTO_RETRY_TAG}"}
    assert trigger.parameters["config"] == "{{ flow_run.parameters.config }}"
    assert trigger.parameters["only_failed"] is True
    assert retrying_pipeline.retries == 1 and retrying_pipeline.name == "eyas-pipeline"
    quiet = {d.name: d for d in build_deployments(RECIPE, tmp_path, auto_retry=False)}
    assert not quiet["extract-retry-failed"].triggers and AUTO_RETRY_TAG not in quiet["extract"].tags


def test_prefect_yaml_is_current(prefect_harness):
    from deployments.team import prefect_yaml, render

    text = render(prefect_yaml(RECIPE, Path("/data/eyas/tiny-demo"), pool="eyas",
                               directory="/opt/eyas", crons={"pipeline": "0 3 * * *"}))
    assert (REPO / "prefect.yaml").read_text() == text, (
        "run: python -m deployments.team --config recipes/tiny-demo.yaml --workdir "
        "/data/eyas/tiny-demo --directory /opt/eyas --cron 'pipeline=0 3 * * *' > prefect.yaml")
    data = yaml.safe_load(text)
    names = [d["name"] for d in data["deployments"]]
    assert names[0] == "pipeline" and "extract-retry-failed" in names
    assert data["deployments"][0]["entrypoint"] == "deployments/serve.py:retrying_pipeline"
    assert data["deployments"][0]["schedules"] == [{"cron": "0 3 * * *"}]


def test_a_default_host_is_the_saved_block_picked_in_the_form(tmp_path, prefect_harness):
    from blocks.gpu_host import GpuHost
    from deployments.serve import build_deployments
    from tasks.hosts import host_spec

    GpuHost(host="192.0.2.10", user="train", num_gpus=8, known_hosts=None).save(
        "deploy-test-host", overwrite=True)
    (dep, *_) = build_deployments(RECIPE, tmp_path, host_block="deploy-test-host")
    ref = dep.parameters["host_block"]
    assert set(ref) == {"$ref"} and "block_document_id" in ref["$ref"]
    # What a run of it (or its cancellation hook) finds there: the saved host.
    assert host_spec(ref).host == "192.0.2.10" and host_spec(ref).num_gpus == 8
