"""The object stores Pulsar's offloaders write to, each behind its own module: S3 today."""
