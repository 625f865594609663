"""What the tests share: helpers (ROOT, wait_until, demo jobs), local Prometheus and
Alertmanager servers, TLS material, and the job scripts tests start as files."""
