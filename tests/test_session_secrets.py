"""``{secret: scope/key}`` on a cluster: read through the Spark session's SQL function ``secret(scope, key)``
(the route the reference gives on a cluster), with scope and key bound as parameters; the REST route only
where the session has no such function.

The session is the local engine's real one; Databricks' ``secret()`` is stood in for by a SQL function of the
same name and signature registered in it (returning NULL for an unknown key), and the REST route by the
workspace stand-in (tests/databricks_jobs_server.py).
"""

from __future__ import annotations

import pytest
from databricks_jobs_server import TOKEN, JobsApiServer

from heartbeat_runner.core.secrets import SecretNotFoundError
from heartbeat_runner.core.settings import Target, load_settings
from heartbeat_runner.jobs.databricks_workspace import DatabricksSecrets, SessionSecrets
from heartbeat_runner.runner.app import open_app

SCOPE_VALUES = {("kafka", "password"): "s3cr3t-from-the-session", ("kafka", "it's"): "quoted-key"}


def test_a_secret_is_read_through_the_sessions_secret_function_else_through_the_rest_route(tmp_path, monkeypatch):
    monkeypatch.delenv("DATABRICKS_CONFIG_PROFILE", raising=False)
    with JobsApiServer() as workspace, open_app(load_settings(lakehouse_dir=str(tmp_path / "lh"))) as app:
        workspace.workspace.put_secret("kafka", "password", "s3cr3t-from-rest")
        monkeypatch.setenv("DATABRICKS_HOST", workspace.host)
        monkeypatch.setenv("DATABRICKS_TOKEN", TOKEN)

        def query(text: str, args: dict[str, object]) -> list:
            return app.engine.sql(text, args).collect()

        # a session without secret() (a Spark that is not Databricks'): the REST route
        plain = SessionSecrets(query, DatabricksSecrets())
        assert plain.secret("kafka", "password") == "s3cr3t-from-rest"
        assert workspace.workspace.reads["kafka/password"] == 1

        from pyspark.sql.types import StringType

        values = dict(SCOPE_VALUES)
        app.engine.spark.udf.register("secret", lambda scope, key: values.get((scope, key)), StringType())
        on_cluster = SessionSecrets(query, DatabricksSecrets())
        assert on_cluster.secret("kafka", "password") == "s3cr3t-from-the-session"
        assert on_cluster.secret("kafka", "it's") == "quoted-key"  # bound, not pasted: a quote is just a character
        assert workspace.workspace.reads["kafka/password"] == 1, "the session answered; REST was not asked"
        with pytest.raises(SecretNotFoundError, match="secret scope 'kafka' has no key 'nope'") as missing:
            on_cluster.secret("kafka", "nope")
        assert "s3cr3t" not in str(missing.value)


def test_the_databricks_target_reads_secrets_through_the_session(tmp_path):
    """App.secrets(): the session's route on the databricks target, the REST route elsewhere."""
    with open_app(load_settings(lakehouse_dir=str(tmp_path / "lh"))) as app:
        assert isinstance(app.secrets(), DatabricksSecrets)
        app.settings = app.settings.with_(target=Target.DATABRICKS)
        assert isinstance(app.secrets(), SessionSecrets)
