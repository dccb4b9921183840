"""The Pulsar broker as a service: the PIP-186 system topic and the liveness probes."""
