"""Prefect layer: flows (see ../shared/design.md). Thin wrappers over tao_data_io."""
