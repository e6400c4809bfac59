"""Reading TAO's status.json: what a container appends while it trains, folded into one status —
the newest values winning, unknown fields ignored, a half-written last line left for the next
read, and never an exception, whatever the job wrote there."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tao_data_io.redaction import Redactor
from tao_data_io.launch.training import KPI_EPOCHS, read_training_status


def lines(*events: dict[str, object]) -> bytes:
    return b"".join(json.dumps(event).encode() + b"\n" for event in events)


def test_the_newest_event_wins_and_kpis_are_kept_epoch_by_epoch() -> None:
    status = read_training_status(lines(
        {"date": "12/1/2026", "time": "9:5:3", "status": "STARTED", "verbosity": "INFO", "message": "Starting"},
        {"status": "RUNNING", "epoch": 1, "max_epoch": 4, "time_per_epoch": "0:02:00", "kpi": {"loss": 0.9},
         "graphical": {"mAP": 0.1}, "network_specific": {"ignored": [1, 2]}},
        {"status": "RUNNING", "epoch": 2, "max_epoch": 4, "kpi": {"loss": 0.5, "mAP": 0.3}}))
    assert status is not None
    assert (status.status, status.epoch, status.max_epoch, status.percent) == ("RUNNING", 2, 4, 50.0)
    assert status.kpi == {"loss": 0.5, "mAP": 0.3}
    assert status.kpi_by_epoch == {1: {"loss": 0.9, "mAP": 0.1}, 2: {"loss": 0.5, "mAP": 0.3}}
    assert status.eta_seconds == 240.0  # two epochs left at two minutes each
    assert status.describe() == "epoch 2 of 4, about 4m left, loss 0.5, mAP 0.3 (RUNNING)"


def test_the_networks_own_eta_wins_and_success_is_complete() -> None:
    status = read_training_status(lines({"status": "RUNNING", "epoch": 3, "max_epoch": 10, "eta": "1 day, 2:00:00",
                                         "time_per_epoch": 60}))
    assert status is not None and status.eta_seconds == 93600.0
    done = read_training_status(lines({"status": "SUCCESS", "epoch": 9, "max_epoch": 10,
                                       "message": "Train finished successfully."}))
    assert done is not None and done.percent == 100.0 and "about" not in done.describe()


def test_a_half_written_last_line_and_noise_are_left_alone() -> None:
    data = b'garbage\n[1, 2]\n{"status": "RUNNING", "epoch": 1, "max_epoch": 2}\n{"status": "RUNNING", "epo'
    status = read_training_status(data)
    assert status is not None and status.epoch == 1
    assert read_training_status(b"") is None and read_training_status(None) is None
    assert read_training_status(b"not json\n{}\n") is None  # nothing a status event holds


def test_only_the_last_epochs_are_kept_for_the_table() -> None:
    events = [{"epoch": epoch, "max_epoch": 500, "kpi": {"loss": 1 / epoch}} for epoch in range(1, 201)]
    status = read_training_status(lines(*events))
    assert status is not None and sorted(status.kpi_by_epoch) == list(range(201 - KPI_EPOCHS, 201))


def test_values_a_job_may_write_are_bounded_and_never_numbers_that_are_not() -> None:
    status = read_training_status(lines({"epoch": True, "max_epoch": -3, "message": "m" * 10_000,
                                         "kpi": {"nan": float("nan"), "ok": 1, "flag": True, "x" * 500: "y" * 500}}))
    assert status is not None and status.epoch is None and status.max_epoch is None
    assert len(status.message or "") <= 160 and "nan" not in status.kpi and "flag" not in status.kpi
    assert status.kpi["ok"] == 1.0 and all(len(name) <= 80 and len(str(v)) <= 80 for name, v in status.kpi.items())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000) | st.lists(st.dictionaries(
    st.sampled_from(["status", "epoch", "max_epoch", "eta", "time_per_epoch", "kpi", "message", "date"]),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.dictionaries(st.text(max_size=5), st.floats() | st.text(max_size=5), max_size=3)), max_size=5).map(
        lambda events: lines(*events)))
def test_whatever_the_file_holds_the_reader_never_raises(data: bytes) -> None:
    status = read_training_status(data)
    if status is not None:
        status.describe()
        assert status.percent is None or 0.0 <= status.percent <= 100.0


def test_a_status_file_built_to_break_the_reader_is_only_not_shown() -> None:
    """Deep nesting (RecursionError in json), numbers that make an endless ETA: no exception, and
    what is shown stays finite."""
    assert read_training_status(b"[" * 200_000 + b"\n") is None
    for event in ({"status": "RUNNING", "epoch": 1, "max_epoch": 100, "time_per_epoch": 1e307},
                  {"status": "RUNNING", "epoch": 1, "max_epoch": 100, "eta": "1e308:0"}):
        status = read_training_status(lines(event))
        assert status is not None and status.epoch == 1
        assert status.eta_seconds is None or math.isfinite(status.eta_seconds)
        status.describe()  # shown without an OverflowError


def test_a_secret_in_status_json_text_is_masked_before_the_text_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each text is cut to a length for display, and a credential the job writes across that cut
    leaves no piece of itself: it is masked first (the environment's credentials by default)."""
    secret = "nvapi-" + "s3cr3tK3y" * 4  # 42 characters
    monkeypatch.setenv("NGC_API_KEY", secret)
    status = read_training_status(lines({
        "date": "d" * 70 + secret, "status": "S" * 70 + secret, "epoch": 1, "max_epoch": 2,
        "kpi": {"k" * 70 + secret: "v" * 70 + secret}}, {"message": "m" * 150 + secret}))
    assert status is not None
    shown = json.dumps(status.model_dump()) + status.describe()
    assert [secret[i:i + 8] for i in range(len(secret) - 7) if secret[i:i + 8] in shown] == []
    assert "m" * 150 + "***NGC_" in shown and "v" * 70 + "***NGC_" in shown


def test_status_json_text_is_masked_with_the_credentials_the_watcher_names() -> None:
    secret = "a-plain-forwarded-value-0123456789"
    mask = Redactor({"WANDB_KEY": secret}, secret_names=["WANDB_KEY"])
    status = read_training_status(lines({"status": "RUNNING", "message": "x" * 140 + secret}), mask=mask)
    assert status is not None and status.message == "x" * 140 + "***WANDB_KEY***"


def test_status_json_text_is_shown_on_one_line_with_its_control_characters_escaped() -> None:
    status = read_training_status(lines({"status": "RUNNING", "message": "a\nFAILURE\x1b[2J\rb\tc",
                                         "kpi": {"lo\nss": "x\x07y"}}))
    assert status is not None and status.message == "a\\nFAILURE\\x1b[2J\\rb\\tc"
    assert status.kpi == {"lo\\nss": "x\\x07y"}
