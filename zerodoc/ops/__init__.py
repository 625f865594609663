"""Operations: what runs beside the job, not in it — the Prometheus rules and Grafana
dashboards generators (alerts/, grafana/), the series budget (cardinality), the file_sd
targets, the local Prometheus + Alertmanager stack, the export of the operations files and
where those files are (resources)."""
