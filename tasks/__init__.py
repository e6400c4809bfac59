"""Prefect layer: tasks (docs/development.md). Thin wrappers over tao_data_io."""
