"""show_progress: a live line on a terminal, nothing otherwise."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = textwrap.dedent("""
    import sys, time
    import dataset_rt as drt

    class Slow:
        def __init__(self, name):
            self.name = name
        def __iter__(self):
            for i in range(40):
                time.sleep(0.02)
                yield drt.CacheInput(b"x" * 1000, {"i": i})

    rt = drt.DatasetRuntime(num_workers=1)
    config = drt.WriterConfig(show_progress=True, prefetch_size=4)
    rt.write_cache([Slow("first"), Slow("second")], sys.argv[1], writer_config=config)
    print("done", flush=True)
""")


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_progress_line_on_a_terminal(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(SCRIPT)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "c")],
        stdout=subprocess.PIPE,
        stderr=terminal,
        cwd=ROOT,
    )
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    assert process.wait(timeout=120) == 0
    os.close(controller)
    text = output.decode()
    assert "writing first" in text and "items/s" in text and "MB/s" in text
    assert "sources 0/2 |" in text and "sources 1/2 ETA " in text  # done count, then an ETA
    assert "wrote 2 source(s)" in text
