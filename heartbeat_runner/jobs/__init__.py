"""Jobs backends: where triggered jobs run (local commands, Databricks Jobs)."""
