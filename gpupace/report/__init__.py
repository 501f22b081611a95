"""Reports and diagnosis from telemetry (in progress)."""
