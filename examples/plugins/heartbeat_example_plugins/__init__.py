"""Example Heartbeat plugins, installed as their own package (see docs/plugins.md).

- ``local_prefix`` (entry point group ``heartbeat.sources``): the objects under an S3-style key
  prefix of a "bucket" that is a local folder;
- ``http_post`` (entry point group ``heartbeat.jobs_backends``): a job run is an HTTP POST to a
  jobs service (``http_service`` is a small one to run beside it).
"""
