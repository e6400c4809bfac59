"""Prefect layer: deployments (docs/development.md). Thin wrappers over tao_data_io."""
