from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_deployment_parameters_are_the_flows_own(tmp_path, prefect_harness):
    from prefect.utilities.callables import parameter_schema

    from deployments.serve import build_deployments
    from flows.evaluate import evaluate_drafter_flow
    from flows.extract import extract_hidden_states
    from flows.pipeline import run_pipeline
    from flows.prepare import prepare_data
    from flows.train import train_drafter_flow

    deps = build_deployments(REPO / "recipes" / "tiny-demo.yaml", tmp_path, cron="0 3 * * *")
    flows = {"prepare-data": prepare_data, "pipeline": run_pipeline, "extract": extract_hidden_states,
             "train": train_drafter_flow, "evaluate": evaluate_drafter_flow}
    assert [d.name for d in deps] == list(flows)
    for dep in deps:
        assert set(dep.parameters) == {"config_path", "workdir"}
        assert set(dep.parameters) <= set(parameter_schema(flows[dep.name].fn).properties)
    assert deps[0].schedules and deps[0].schedules[0].schedule.cron == "0 3 * * *"
