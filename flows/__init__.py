"""Prefect layer: flows (docs/development.md). Thin wrappers over tao_data_io."""
