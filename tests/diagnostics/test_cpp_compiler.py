"""The C++ compiler Inductor's CPU kernels need, and so the CPU emulator: ``doctor --device
cpu`` names it, found or not; without one the demo and ``report`` say so in one line, with
the fix, instead of Inductor's traceback."""

import os
import subprocess
import sys

from torch._inductor import config as inductor_config

from inductor_xpugraph import __main__
from inductor_xpugraph.diagnostics import cpp_compiler, doctor
from inductor_xpugraph.diagnostics.findings import Status


def test_doctor_on_the_emulator_without_a_compiler_fails_naming_the_compiler_it_needs(tmp_path):
    no_compilers = tmp_path / "bin"
    no_compilers.mkdir()
    env = {**os.environ, "PATH": str(no_compilers), "CXX": str(tmp_path / "nowhere" / "g++")}
    command = [sys.executable, "-m", "inductor_xpugraph", "doctor", "--device", "cpu", "--no-probe"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if "C++ compiler (cpu)" in line)
    assert line.startswith("FAIL  C++ compiler (cpu): the CPU emulator needs a C++ compiler")
    assert f"looked for {tmp_path / 'nowhere' / 'g++'} (torch._inductor.config.cpp.cxx" in line
    assert "-> install one (g++: apt install g++" in result.stdout
    assert "CXX environment variable" in result.stdout


def test_the_compiler_inductor_would_use_is_an_ok_line(tmp_path):
    compiler = tmp_path / "my-g++"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    with inductor_config.patch({"cpp.cxx": (None, str(compiler))}):
        (finding,) = doctor.check_cpp_compiler(emulator=True)
    assert finding.status is Status.OK
    assert finding.detail.startswith(f"{compiler}: Inductor compiles the CPU emulator's kernels")


def test_the_demo_on_the_emulator_without_a_compiler_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cpp_compiler, "found", lambda: None)
    assert __main__.main(["demo", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: the CPU emulator needs a C++ compiler")
    assert "Fix: install one" in err


def test_report_of_a_script_a_missing_compiler_stopped_says_so_in_one_line(tmp_path, capsys):
    script = tmp_path / "compiles_on_the_cpu.py"
    script.write_text(
        "from torch._inductor.exc import InvalidCxxCompiler\n"
        "raise RuntimeError('backend compiler failed') from InvalidCxxCompiler()\n"
    )
    assert __main__.main(["report", str(script)]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: Inductor could not compile a CPU kernel: it finds no C++")
    assert "Fix: install one" in last
