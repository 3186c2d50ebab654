"""Settings are checked wherever they come from: environment, assignment, patch. A bad value
set in code raises ValueError naming the setting and what it accepts, and applies nothing; a
bad environment value is warned about once at import, naming the variable and what it
accepts, and ignored (this package's command line says it in one line, and the doctor reports
it)."""

import os
import subprocess
import sys
import warnings

import pytest

import inductor_xpugraph
from inductor_xpugraph._settings import environment_value

config = inductor_xpugraph.config


def import_with(environment: dict[str, str], code: str = "") -> subprocess.CompletedProcess:
    script = "import inductor_xpugraph\n" + code
    env = {**os.environ, **environment}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("text, expected", [("false", False), ("0", False), ("Yes", True)])
def test_boolean_environment_values_are_parsed(text, expected, monkeypatch):
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_ALLOCATOR_CHECKPOINTING", text)
    value = environment_value(
        "allocator_checkpointing", "INDUCTOR_XPUGRAPH_ALLOCATOR_CHECKPOINTING", not expected
    )
    assert value is expected


def test_a_size_in_gib_from_the_environment_is_a_float(monkeypatch):
    variable = "INDUCTOR_XPUGRAPH_INITIAL_POOL_ALLOCATION_GB"
    monkeypatch.setenv(variable, "0.25")
    assert environment_value("initial_pool_allocation_gb", variable, 0.0) == 0.25


@pytest.mark.parametrize(
    "name, variable, text",
    [
        ("skip_dynamic_graphs", "INDUCTOR_XPUGRAPH_SKIP_DYNAMIC_GRAPHS", "maybe"),
        ("rerecord_limit", "INDUCTOR_XPUGRAPH_RERECORD_LIMIT", "abc"),
        ("rerecord_limit", "INDUCTOR_XPUGRAPH_RERECORD_LIMIT", "-1"),
        ("warmup_runs", "INDUCTOR_XPUGRAPH_WARMUP_RUNS", "0"),
        ("initial_pool_allocation_gb", "INDUCTOR_XPUGRAPH_INITIAL_POOL_ALLOCATION_GB", "lots"),
        ("initial_pool_allocation_gb", "INDUCTOR_XPUGRAPH_INITIAL_POOL_ALLOCATION_GB", "-1"),
        ("initial_pool_allocation_gb", "INDUCTOR_XPUGRAPH_INITIAL_POOL_ALLOCATION_GB", "inf"),
    ],
)
def test_a_bad_environment_value_is_refused_naming_the_variable_and_the_value(
    name, variable, text, monkeypatch
):
    monkeypatch.setenv(variable, text)
    with pytest.raises(ValueError) as refused:
        environment_value(name, variable, getattr(config, name))
    assert variable in str(refused.value) and repr(text) in str(refused.value)


@pytest.mark.parametrize(
    "name, variable, accepted",
    [
        ("warmup_runs", "INDUCTOR_XPUGRAPH_WARMUP_RUNS", "an integer >= 1"),
        ("initial_pool_allocation_gb", "INDUCTOR_XPUGRAPH_INITIAL_POOL_ALLOCATION_GB", ">= 0"),
    ],
)
def test_a_number_that_does_not_parse_is_refused_with_what_the_setting_accepts(
    name, variable, accepted, monkeypatch
):
    monkeypatch.setenv(variable, "abc")
    with pytest.raises(ValueError, match=accepted) as refused:
        environment_value(name, variable, getattr(config, name))
    assert "invalid literal" not in str(refused.value)


def test_a_bad_environment_value_is_warned_about_at_the_import_line_and_the_default_kept():
    result = import_with(
        {"INDUCTOR_XPUGRAPH_RERECORD_LIMIT": "abc"},
        "print(inductor_xpugraph.config.rerecord_limit)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "8"
    (warning,) = [line for line in result.stderr.splitlines() if "Warning" in line]
    assert warning.startswith(
        "<string>:1: SettingIgnoredWarning: INDUCTOR_XPUGRAPH_RERECORD_LIMIT="
    )
    assert "must be an integer >= 0" in warning
    assert warning.endswith("ignored: rerecord_limit keeps its default, 8")


def test_each_refused_variable_is_warned_about_once(monkeypatch):
    from inductor_xpugraph import _settings

    monkeypatch.setattr(_settings, "refused", None)
    monkeypatch.setattr(_settings, "_warned", set())
    with pytest.warns(_settings.SettingIgnoredWarning) as warned:
        for _ in range(2):
            _settings.refuse("INDUCTOR_XPUGRAPH_DEVICES", "INDUCTOR_XPUGRAPH_DEVICES='gpu': ...")
    assert len(warned) == 1


def test_a_bad_device_list_is_warned_about_and_enables_nothing():
    code = (
        "import warnings\n"
        "import torch._inductor.codegen.common as common\n"
        "common.init_backend_registration()\n"
        "stock = common.get_wrapper_codegen_for_device('cpu')\n"
        "with warnings.catch_warnings(record=True) as warned:\n"
        "    warnings.simplefilter('always')\n"
        "    import inductor_xpugraph\n"
        "for warning in warned:\n"
        "    if warning.category.__name__ == 'SettingIgnoredWarning':\n"
        "        print('warned:', warning.message)\n"
        "print(inductor_xpugraph.enabled_devices())\n"
        "print(common.get_wrapper_codegen_for_device('cpu') is stock)\n"
    )
    env = {**os.environ, "INDUCTOR_XPUGRAPH_DEVICES": "cpu,bogus"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    warned, enabled, stock_kept = result.stdout.strip().splitlines()
    assert warned.startswith("warned: INDUCTOR_XPUGRAPH_DEVICES='cpu,bogus'"), result.stderr
    assert "it takes a comma-separated list of xpu, cuda, cpu" in warned
    assert warned.endswith("ignored: no device is enabled from it (not even xpu, the default)")
    assert (enabled, stock_kept) == ("()", "True")


@pytest.mark.parametrize(
    "argv, orig_argv, is_the_command_line",
    [
        (["-m", "doctor"], ["python", "-m", "inductor_xpugraph", "doctor"], True),
        (["-m"], ["python", "-X", "dev", "-minductor_xpugraph"], True),
        (["/venv/bin/inductor-xpugraph"], ["python", "/venv/bin/inductor-xpugraph"], True),
        (["-m", "doctor"], ["python", "-m", "mytool", "doctor"], False),  # imports us
        (["-m"], ["python", "-m", "inductor_xpugraph.deploy"], False),
        (["train.py"], ["python", "train.py"], False),
        (["-c"], ["python", "-c", "import inductor_xpugraph"], False),
    ],
)
def test_only_this_packages_command_line_is_exempt_from_raising(
    monkeypatch, argv, orig_argv, is_the_command_line
):
    from inductor_xpugraph import _settings

    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert _settings._imported_by_the_command_line() is is_the_command_line


def test_under_the_command_line_a_refused_value_is_recorded_and_the_default_kept(monkeypatch):
    from inductor_xpugraph import _settings

    monkeypatch.setattr(_settings, "refused", {})
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_WARMUP_RUNS", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # recorded, not warned about
        assert _settings.from_environment("warmup_runs", "INDUCTOR_XPUGRAPH_WARMUP_RUNS", 1) == 1
    (why,) = _settings.refused.values()
    assert why.startswith("INDUCTOR_XPUGRAPH_WARMUP_RUNS='0' is not a valid value")


def test_a_command_other_than_the_doctor_says_a_bad_setting_in_one_line_and_goes_on(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("print('ran')\n")
    env = {**os.environ, "INDUCTOR_XPUGRAPH_WARMUP_RUNS": "0"}
    command = [sys.executable, "-m", "inductor_xpugraph", "report", str(script)]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"
    said, hint = result.stderr.splitlines()[:2]
    assert said.startswith("warning: INDUCTOR_XPUGRAPH_WARMUP_RUNS='0' is not a valid value")
    assert said.endswith("ignored: warmup_runs keeps its default, 1")
    assert "python -m inductor_xpugraph doctor" in hint


@pytest.mark.parametrize(
    "name, value",
    [
        ("rerecord_limit", "abc"),
        ("rerecord_limit", -1),
        ("rerecord_window", 0),
        ("static_input_variants", 0),
        ("warmup_runs", True),
        ("allocator_checkpointing", "false"),
        ("skip_dynamic_graphs", 1),
        ("debug_checks", "yes"),
        ("initial_pool_allocation_gb", -0.5),
        ("initial_pool_allocation_gb", True),
    ],
)
def test_a_bad_value_set_in_code_raises_and_keeps_the_old_one(name, value):
    before = getattr(config, name)
    with pytest.raises(ValueError, match=f"inductor_xpugraph.config.{name} must be"):
        setattr(config, name, value)
    assert getattr(config, name) == before


def test_a_patch_with_one_bad_value_applies_none_of_them():
    before = (config.rerecord_limit, config.warmup_runs)
    with pytest.raises(ValueError, match="warmup_runs"):
        with config.patch(rerecord_limit=3, warmup_runs=0):
            pass
    assert (config.rerecord_limit, config.warmup_runs) == before


def test_every_setting_is_checked_and_read_from_the_environment():
    from inductor_xpugraph._settings import CHECKS

    assert set(CHECKS) == set(config._config), "a setting without a check"


def test_good_values_are_accepted():
    with config.patch(rerecord_limit=0, rerecord_window=1, skip_dynamic_graphs=True):
        assert (config.rerecord_limit, config.rerecord_window) == (0, 1)
        assert config.skip_dynamic_graphs is True


def test_operator_lists_from_the_environment_are_comma_separated():
    result = import_with(
        {"INDUCTOR_XPUGRAPH_NEVER_CAPTURE_OPS": "mylib::wait_for_host, aten::mm.out"},
        "print(inductor_xpugraph.config.never_capture_ops)",
    )
    assert result.stdout.strip() == "('mylib::wait_for_host', 'aten::mm.out')", result.stderr


def test_an_operator_name_without_its_namespace_is_refused_and_changes_nothing():
    before = config.never_capture_ops
    with pytest.raises(ValueError, match="never_capture_ops must be a tuple of operator names"):
        config.never_capture_ops = ("_scaled_dot_product_flash_attention",)
    assert config.never_capture_ops == before


def test_the_readme_example_for_intel_gpus_sets_the_operator_lists():
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("## On Intel GPUs") :]
    start = section.index("```python\n") + len("```python\n")
    example = section[start : section.index("```\n", start)]
    # The patch gives both lists back after the block, whatever it set.
    with config.patch(allow_capture_ops=(), never_capture_ops=()):
        exec(compile(example, "README.md", "exec"), {})
        assert config.allow_capture_ops == ("aten::_scaled_dot_product_flash_attention",)
        assert config.never_capture_ops == ("mylib::wait_for_host",)
    assert config.allow_capture_ops == () and config.never_capture_ops == ()
