"""The `gate` process ends without the interpreter's module teardown, and nothing a normal exit keeps is lost:
the exit status, exit handlers (and what they write), buffered output, and threads still at work."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from servegate.cli.process_exit import exit_status


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run `body` (which defines main()) under run_then_exit in a fresh interpreter."""
    script = textwrap.dedent(body) + "\nfrom servegate.cli.process_exit import run_then_exit\nrun_then_exit(main)\n"
    return subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )


def test_exit_status_follows_python(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status(None) == 0
    assert exit_status(3) == 3
    assert exit_status("no manifest given") == 1
    assert capsys.readouterr().err == "no manifest given\n"


def test_status_handlers_and_buffered_output_survive(tmp_path: Path) -> None:
    done = _run(
        """
        import atexit, sys
        from pathlib import Path

        def main():
            atexit.register(lambda: Path("handler.txt").write_text("ran"))
            sys.stdout.write("no newline, still buffered")
            sys.stderr.write("to stderr")
            sys.exit(3)
        """,
        tmp_path,
    )
    assert done.returncode == 3
    assert done.stdout == "no newline, still buffered"
    assert done.stderr == "to stderr"
    assert (tmp_path / "handler.txt").read_text() == "ran"


def test_a_returning_main_exits_0_and_a_string_exit_1(tmp_path: Path) -> None:
    assert _run("def main():\n    return None\n", tmp_path).returncode == 0
    done = _run("import sys\ndef main():\n    sys.exit('bad input')\n", tmp_path)
    assert (done.returncode, done.stderr) == (1, "bad input\n")


def test_a_thread_still_at_work_is_joined(tmp_path: Path) -> None:
    done = _run(
        """
        import threading, time
        from pathlib import Path

        def late():
            time.sleep(0.5)
            Path("thread.txt").write_text("finished")

        def main():
            threading.Thread(target=late).start()
        """,
        tmp_path,
    )
    assert done.returncode == 0
    assert (tmp_path / "thread.txt").read_text() == "finished"


def test_an_error_still_prints_its_traceback(tmp_path: Path) -> None:
    done = _run("def main():\n    raise RuntimeError('a bug')\n", tmp_path)
    assert done.returncode == 1
    assert "RuntimeError: a bug" in done.stderr


def test_the_gate_command_exits_with_its_status(tmp_path: Path) -> None:
    gate = [sys.executable, "-m", "servegate.cli"]
    version = subprocess.run([*gate, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert (version.returncode, version.stdout.startswith("servegate ")) == (0, True)
    missing = subprocess.run(
        [*gate, "check", str(tmp_path / "missing.yaml")], capture_output=True, text=True, timeout=60, check=False
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().endswith("missing.yaml: file not found")
