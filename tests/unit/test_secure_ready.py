"""The secured broker's readiness check (ops/kafka/secure_ready.py) where no broker is needed: a
settings file it cannot use is refused at once, a broker that never answers is waited for until
the timeout, which says so. tests/secure/test_authentication.py checks it against the broker."""

from __future__ import annotations

from pathlib import Path

from ops.kafka.secure_ready import main
from tests.support.network import free_port


def test_a_missing_or_malformed_settings_file_is_refused_at_once(tmp_path: Path, capsys):
    missing = tmp_path / "missing.properties"
    assert main(["--bootstrap", "127.0.0.1:9192", "--config", str(missing)]) == 2
    assert "cannot read kafka config file" in capsys.readouterr().err
    malformed = tmp_path / "malformed.properties"
    malformed.write_text("security.protocol\n", encoding="utf-8")
    assert main(["--bootstrap", "127.0.0.1:9192", "--config", str(malformed)]) == 2
    assert "line 1: expected key=value" in capsys.readouterr().err


def test_a_setting_librdkafka_refuses_is_not_retried(tmp_path: Path, capsys):
    config = tmp_path / "bad.properties"
    config.write_text("security.protocol=CARRIER_PIGEON\n", encoding="utf-8")
    assert main(["--bootstrap", "127.0.0.1:9192", "--config", str(config)]) == 2
    assert "security.protocol" in capsys.readouterr().err


def test_a_broker_that_never_answers_is_waited_for_until_the_timeout(tmp_path: Path, capsys):
    config = tmp_path / "plain.properties"
    config.write_text("# nothing secured\n", encoding="utf-8")
    bootstrap = f"127.0.0.1:{free_port()}"
    assert main(["--bootstrap", bootstrap, "--config", str(config), "--timeout", "1.5"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kafka not ready at {bootstrap} after 1.5 s"), err
