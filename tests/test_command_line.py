"""The command line's first moments: help, usage errors and errors that need no torch (a path
that is not an export, a missing script, a device torch was not built for) answer without
importing it, a device this torch lacks is one line and exit status 2, the usage names the
program."""

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


def test_the_demos_help_says_what_each_option_does():
    done = run_command("demo", "--help")
    options = " ".join(done.stdout.split()).split("options: ", 1)[1]
    assert "--device {xpu,cuda,cpu} run on this device (cpu: the CPU emulator)." in options
    assert "--layers N the model's depth: N x (Linear 64 + GELU) (default: 16)" in options


def test_an_unknown_command_is_a_usage_error_without_importing_torch():
    done = run_command("frobnicate")
    assert done.returncode == 2 and "invalid choice: 'frobnicate'" in done.stderr
    assert "torch" not in modules_imported(done.stderr)


@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without cuda")
def test_the_demo_on_a_device_this_torch_sees_none_of_says_so_in_one_line(capsys):
    assert __main__.main(["demo", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sees no cuda device" in err


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a torch built without cuda")
def test_the_demo_on_a_device_this_torch_is_not_built_for_answers_without_importing_torch():
    done = run_command("demo", "--device", "cuda")
    assert done.returncode == 2
    assert f"this torch ({torch.__version__}) is not built for cuda" in done.stderr
    assert "torch" not in modules_imported(done.stderr)


def test_inspect_of_a_missing_export_answers_without_importing_torch(tmp_path):
    done = run_command("inspect", str(tmp_path / "missing"))
    assert done.returncode == 2 and "is not an inductor_xpugraph export" in done.stderr
    assert "torch" not in modules_imported(done.stderr)


def test_inspect_says_of_a_missing_export_what_the_export_reader_says(tmp_path):
    from inductor_xpugraph.deploy import ArtifactError, describe

    missing = tmp_path / "missing"
    with pytest.raises(ArtifactError) as raised:
        describe(str(missing))
    done = run_command("inspect", str(missing))
    assert done.stderr.splitlines()[-1] == f"error: {raised.value}"


def test_inspect_of_a_file_says_it_is_not_an_export_directory_and_what_one_is(tmp_path):
    model = tmp_path / "model.pt"
    model.write_bytes(b"")
    done = run_command("inspect", str(model))
    assert done.returncode == 2
    assert f"{model} is not an inductor_xpugraph export directory: it is a file; " in done.stderr
    assert "its manifest, inductor_xpugraph.json, beside the compiled graphs" in done.stderr
    assert "torch" not in modules_imported(done.stderr)


def test_inspect_of_a_directory_without_a_manifest_answers_without_importing_torch(tmp_path):
    done = run_command("inspect", str(tmp_path))
    assert done.returncode == 2
    assert "the directory holds no inductor_xpugraph.json; an export is the directory" in (
        done.stderr
    )
    assert "torch" not in modules_imported(done.stderr)


def test_report_of_a_missing_script_answers_without_importing_torch(tmp_path):
    done = run_command("report", str(tmp_path / "missing.py"))
    assert done.returncode == 2 and "no such file" in done.stderr
    assert "torch" not in modules_imported(done.stderr)


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
