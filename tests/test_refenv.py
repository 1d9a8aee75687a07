"""``refenv.skip_or_fail``: registry-dependent suites skip locally and fail under CI."""

from __future__ import annotations

import pytest
from refenv import CI_ENV_VAR, running_in_ci, skip_or_fail


@pytest.mark.parametrize("value", ["true", "1", "yes", "True"])
def test_fails_with_the_reason_under_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(CI_ENV_VAR, value)
    assert running_in_ci()
    with pytest.raises(pytest.fail.Exception) as info:
        skip_or_fail("dataset-rt 0.4.8 reference unavailable: no registry")
    assert "dataset-rt 0.4.8 reference unavailable: no registry" in str(info.value)
    assert CI_ENV_VAR in str(info.value)


@pytest.mark.parametrize("value", [None, "", "0", "false", "no"])
def test_skips_outside_ci(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(CI_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(CI_ENV_VAR, value)
    assert not running_in_ci()
    with pytest.raises(pytest.skip.Exception) as info:
        skip_or_fail("the ray extra cannot be installed: no registry")
    assert str(info.value) == "the ray extra cannot be installed: no registry"
