import pytest

from dlperf.profile import ENV_VAR, run_profile


def test_default_is_quick_without_gpu_and_full_with_one():
    assert run_profile({}, cuda_available=False).name == "quick"
    assert run_profile({}, cuda_available=True).name == "full"


@pytest.mark.parametrize("value, expected", [("quick", "quick"), ("FULL", "full"), (" full ", "full")])
def test_environment_variable_wins_over_hardware(value, expected):
    profile = run_profile({ENV_VAR: value}, cuda_available=(expected == "quick"))
    assert profile.name == expected
    assert ENV_VAR in profile.reason


def test_unknown_profile_is_a_clear_error():
    with pytest.raises(ValueError, match="quick.*full"):
        run_profile({ENV_VAR: "fast"}, cuda_available=False)


def test_pick_chooses_by_profile():
    assert run_profile({ENV_VAR: "quick"}).pick(quick=1, full=2) == 1
    assert run_profile({ENV_VAR: "full"}).pick(quick=1, full=2) == 2


def test_reads_the_real_environment(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "full")
    assert run_profile().full
