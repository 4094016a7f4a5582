"""tasks.progress: a progress artifact moves at most once per interval, and always at the end."""

from __future__ import annotations


def _value(client, artifact_id) -> float:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId

    (art,) = client.read_artifacts(artifact_filter=ArtifactFilter(id=ArtifactFilterId(
        any_=[artifact_id])))
    return art.data


def test_progress_artifact_moves_at_most_once_per_interval_and_always_at_the_end(prefect_client):
    from prefect import flow
    from prefect.artifacts import create_progress_artifact

    from tasks.progress import ThrottledProgress

    @flow(name="throttle-probe")
    def probe(interval: float, last: int, total_each_call: bool) -> tuple[str, int]:
        artifact_id = str(create_progress_artifact(0.0, key="throttle-test"))
        if total_each_call:  # the total known only as work goes (generation's progress)
            progress = ThrottledProgress(artifact_id, interval=interval)
            for done in range(1, last + 1):
                progress(done, 10)
        else:
            progress = ThrottledProgress(artifact_id, 10, interval=interval, label="step")
            for done in range(1, last + 1):
                progress(done)
        return artifact_id, progress.updates

    artifact_id, updates = probe(3600.0, 10, False)
    assert updates == 2  # the first step, then the last (the interval never passed)
    assert _value(prefect_client, artifact_id) == 100.0
    artifact_id, updates = probe(0.0, 3, False)
    assert updates == 3 and _value(prefect_client, artifact_id) == 30.0
    artifact_id, updates = probe(3600.0, 10, True)
    assert updates == 2 and _value(prefect_client, artifact_id) == 100.0


def test_without_an_artifact_nothing_is_sent():
    from tasks.progress import ThrottledProgress

    progress = ThrottledProgress(None, 10, interval=0.0)
    for done in range(1, 11):
        progress(done)
    assert progress.updates == 0
