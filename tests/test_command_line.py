"""The command line's first moments: help and usage errors answer without importing torch,
a device this torch lacks is one line and exit status 2, the usage names the program."""

import subprocess
import sys

import pytest
import torch

from inductor_xpugraph import __main__


def run_command(*args):
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "inductor_xpugraph", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def modules_imported(stderr: str) -> set[str]:
    """The module names ``-X importtime`` reported."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if "|" in line}


def test_help_prints_the_commands_without_importing_torch():
    done = run_command("--help")
    assert done.returncode == 0 and "demo" in done.stdout and "doctor" in done.stdout
    assert "torch" not in modules_imported(done.stderr)


def test_an_unknown_command_is_a_usage_error_without_importing_torch():
    done = run_command("frobnicate")
    assert done.returncode == 2 and "invalid choice: 'frobnicate'" in done.stderr
    assert "torch" not in modules_imported(done.stderr)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without cuda")
def test_the_demo_on_a_device_this_torch_lacks_says_so_in_one_line(capsys):
    assert __main__.main(["demo", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sees no cuda device" in err


def test_the_usage_names_the_script_it_was_started_as(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/inductor-xpugraph"])
    with pytest.raises(SystemExit):
        __main__.main(["frobnicate"])
    assert capsys.readouterr().err.startswith("usage: inductor-xpugraph ")


def test_the_parsers_choices_are_the_packages():
    from inductor_xpugraph.diagnostics.probe_report import PROBE_TIMEOUT
    from inductor_xpugraph.sycl_rules.releases import RELEASES

    assert __main__.SYCL_RULES_RELEASES == tuple(sorted(RELEASES))
    assert __main__.PROBE_TIMEOUT == PROBE_TIMEOUT


def test_report_without_a_script_says_a_script_is_required(capsys):
    with pytest.raises(SystemExit) as exited:
        __main__.main(["report"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "a script to run is required" in err
    assert "script_args" not in err


def test_an_unknown_option_is_said_with_the_commands_own_usage(capsys):
    with pytest.raises(SystemExit) as exited:
        __main__.main(["inspect", "export-dir", "--bogus"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "unrecognized arguments: --bogus" in err
    assert err.startswith("usage: python -m inductor_xpugraph inspect ")
