from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_deployment_parameters_are_the_flows_own(tmp_path, prefect_harness):
    from deployments.serve import build_deployments

    (dep,) = build_deployments(REPO / "recipes" / "tiny-demo.yaml", tmp_path, cron="0 3 * * *")
    assert dep.name == "prepare-data"
    assert set(dep.parameters) == {"config_path", "workdir"}
    from prefect.utilities.callables import parameter_schema

    from flows.prepare import prepare_data

    assert set(dep.parameters) <= set(parameter_schema(prepare_data.fn).properties)
    assert dep.schedules and dep.schedules[0].schedule.cron == "0 3 * * *"
