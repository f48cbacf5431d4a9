"""CLI conventions (issue 16.6) through the real `fleetprof` CLI in subprocesses, against a live server: one exit
code per kind of failure, `--format json` alone on stdout, `--version`, shell completion, progress on a TTY only,
and the summary `fleetprof run` ends with."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetprof.errors import EXIT_CODE_MEANINGS, ExitCode
from tests.conftest import free_port

FLEETPROF = [sys.executable, "-m", "fleetprof.cli"]
DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURE = DATA / "nvidia-smi" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
TRACE = DATA / "kineto" / "tracelens" / "h100" / "gaunernst_bert-small-uncased__1016001.json.gz"


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETPROF, *args], env=env, capture_output=True, text=True, timeout=timeout)


def on_a_tty(env: dict[str, str], *args: str, timeout: float = 120) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (stdout a pipe): (exit status, stdout, what the terminal showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*FLEETPROF, *args], env=env, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    shown = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise TimeoutError(shown.decode(errors="replace"))
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert proc.stdout is not None
    out = proc.stdout.read()
    return proc.wait(timeout), out, shown.decode(errors="replace")


@pytest.fixture
def env(cli_env, live_server, make_token) -> dict[str, str]:
    return {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("operator")}


def test_each_failure_has_its_exit_code(env, make_token, tmp_path):
    assert cli(env, "replay", str(CAPTURE), "--job-id", "codes-1", "--node", "n1").returncode == 0
    one_line = []

    def expect(code: ExitCode, *args: str, environ: dict[str, str] = env, says: str = "") -> None:
        r = cli(environ, *args)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert r.stdout == "" and "Traceback" not in r.stderr and says in r.stderr, (args, r.stderr)
        one_line.append(r.stderr.strip().count("\n") == 0)

    expect(ExitCode.USAGE, "report", "no such id", says="job id")  # refused before any request
    expect(ExitCode.USAGE, "report", "codes-1", environ={k: v for k, v in env.items() if k != "FLEETPROF_TOKEN"},
           says="FLEETPROF_TOKEN")
    expect(ExitCode.USAGE, "import-trace", "codes-1", str(tmp_path / "missing.json"), says="cannot read")
    expect(ExitCode.USAGE, "report", "codes-1", "-o", str(tmp_path / "no" / "dir.txt"), says="cannot write")
    expect(ExitCode.NOT_FOUND, "report", "no-such-job", says="404")
    expect(ExitCode.NOT_FOUND, "rightsizing", "--name", "nope", says="404")
    expect(ExitCode.AUTH, "report", "codes-1", environ={**env, "FLEETPROF_TOKEN": "fp_not-a-token"}, says="401")
    agent = make_token("agent", node="n1")  # writes for its node, reads no reports
    expect(ExitCode.AUTH, "report", "codes-1", environ={**env, "FLEETPROF_TOKEN": agent}, says="403")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    expect(ExitCode.UNAVAILABLE, "report", "codes-1", environ={**env, "FLEETPROF_SERVER_URL": closed},
           says="ConnectError")
    expect(ExitCode.UNAVAILABLE, "replay", str(CAPTURE), "--job-id", "codes-2", "--node", "n1", "--retry-for", "0",
           environ={**env, "FLEETPROF_SERVER_URL": closed})
    junk = tmp_path / "junk.json"
    junk.write_text('{"not": "a trace"}')
    expect(ExitCode.REJECTED, "import-trace", "codes-1", str(junk), says="HTTP 4")
    expect(ExitCode.NOT_FOUND, "token", "revoke", "999999", says="no token")
    assert all(one_line)
    assert cli(env, "report", "codes-1").returncode == ExitCode.OK
    assert set(ExitCode) == set(EXIT_CODE_MEANINGS)  # every code is documented


def test_usage_errors_of_argparse_are_2(cli_env):
    r = cli(cli_env, "report", "x", "--format", "yaml")
    assert r.returncode == ExitCode.USAGE and "invalid choice" in r.stderr


@pytest.mark.parametrize(("command", "variable", "value"), [
    (("agent", "--source", "fake:1", "--server", "http://127.0.0.1:9", "--token", "t"), "FLEETPROF_POWER_INSTANT_10HZ",
     "maybe"),
    (("agent", "--source", "fake:1", "--server", "http://127.0.0.1:9", "--token", "t"), "FLEETPROF_INTERVAL_S", "abc"),
])
def test_a_setting_that_does_not_parse_is_one_line_and_2(cli_env, command, variable, value):
    r = cli({**cli_env, variable: value}, *command, timeout=60)
    assert r.returncode == ExitCode.USAGE and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert f"invalid setting {variable}" in r.stderr and repr(value) in r.stderr


def test_version(cli_env):
    r = cli(cli_env, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"fleetprof {importlib.metadata.version('fleetprof')}"


def test_json_alone_on_stdout(env, tmp_path):
    replay = cli(env, "replay", str(CAPTURE), "--job-id", "json-1", "--node", "n1", "--format", "json")
    assert replay.returncode == 0, replay.stderr
    sent = json.loads(replay.stdout)
    assert sent["job_id"] == "json-1" and sent["samples"] > 0 and sent["gpus"] == 1 and sent["state"] == "finished"
    assert "replayed" in replay.stderr  # the message for people stays on stderr

    upload = cli(env, "import-trace", "json-1", str(TRACE), "--format", "json")
    assert upload.returncode == 0, upload.stderr
    answer = json.loads(upload.stdout)
    assert answer["job_id"] == "json-1" and answer["uploads"][0]["kind"] == "kineto"
    assert answer["uploads"][0]["uploaded_bytes"] == TRACE.stat().st_size

    created = cli(env, "token", "create", "--scope", "team", "--team", "vision", "--format", "json")
    assert created.returncode == 0, created.stderr
    token = json.loads(created.stdout)
    assert token["scope"] == "team" and token["team"] == "vision" and token["token"].startswith("fp_")
    listed = cli(env, "token", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert token["token"][:10] in [r["prefix"] for r in rows] and all("token" not in r for r in rows)
    revoked = cli(env, "token", "revoke", "--token", token["token"], "--format", "json")
    assert json.loads(revoked.stdout)["revoked_now"] is True

    for args in (("report", "json-1"), ("rightsizing", "json-1")):
        r = cli(env, *args, "--format", "json")
        assert r.returncode == 0 and isinstance(json.loads(r.stdout), dict), (args, r.stderr)


def test_completion_scripts_parse_and_complete(cli_env, tmp_path):
    bash = cli(cli_env, "completion", "bash")
    assert bash.returncode == 0, bash.stderr
    script = tmp_path / "fleetprof.bash"
    script.write_text(bash.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0

    def complete(*words: str, setup: str = "") -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        probe = (f"{setup}source {script}; COMP_WORDS=({line}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); "
                 "_fleetprof; printf '%s\\n' \"${COMPREPLY[@]}\"")
        r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete("fleetprof", "rep") == ["report", "replay"]
    assert complete("fleetprof", "report", "x", "--format", "") == ["table", "json", "html"]
    assert complete("fleetprof", "token", "create", "--scope", "") == ["agent", "team", "scheduler", "operator"]
    assert complete("fleetprof", "token", "create", "--team", "ab", "--sc") == ["--scope"]
    assert "--retry-for" in complete("fleetprof", "replay", "f.csv", "--")
    assert complete("fleetprof", "run", "--", "py") == []  # the command's own words: the shell's default
    # ... or, with bash-completion loaded, the command's own completion from the word after `--` (stubbed here)
    offset = '_command_offset() { COMPREPLY=("from-word-$1"); }; '
    assert complete("fleetprof", "run", "--job-id", "x", "--", "py", setup=offset) == ["from-word-5"]
    assert complete("fleetprof", "--ver") == ["--version"]

    zsh = cli(cli_env, "completion", "zsh")
    assert zsh.returncode == 0 and "compdef _fleetprof fleetprof" in zsh.stdout
    if shutil.which("zsh") is None:
        pytest.skip("zsh not installed: the zsh script is not checked")
    zscript = tmp_path / "fleetprof.zsh"
    zscript.write_text(zsh.stdout)
    assert subprocess.run(["zsh", "-n", str(zscript)], capture_output=True).returncode == 0
    # zsh's completion system stubbed: what the function hands compadd
    probe = ("compdef() { :; }; compadd() { [[ $1 == -a ]] && print -l ${(P)2}; }; _files() { print FILES; }; "
             f"source {zscript}; words=(fleetprof report x --format ''); CURRENT=5; _fleetprof")
    r = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == ["table", "json", "html"], r.stderr


def test_progress_only_on_a_tty(env):
    code, out, shown = on_a_tty(env, "replay", str(CAPTURE), "--job-id", "tty-1", "--node", "n1",
                                "--batch-steps", "1", "--format", "json")
    assert code == 0, shown
    assert "\rreplay tty-1 [" in shown and "100.0 %" in shown and "samples" in shown
    assert json.loads(out)["samples"] > 0  # the bar never reaches stdout
    code, _, shown = on_a_tty(env, "import-trace", "tty-1", str(TRACE))
    assert code == 0 and f"\rupload {TRACE.name} [" in shown and "100.0 %" in shown, shown

    piped = cli(env, "replay", str(CAPTURE), "--job-id", "tty-2", "--node", "n1", "--batch-steps", "1")
    assert piped.returncode == 0 and "\r" not in piped.stderr and "[" not in piped.stderr, piped.stderr
    piped = cli(env, "import-trace", "tty-2", str(TRACE))
    assert piped.returncode == 0 and "\r" not in piped.stderr, piped.stderr


def test_run_ends_with_a_summary_on_stderr(env, live_server):
    job = [sys.executable, "-c", "import time; time.sleep(0.2); print('trained')"]
    r = cli(env, "run", "--job-id", "sum-1", "--no-hooks", "--", *job)
    assert r.returncode == 0 and r.stdout == "trained\n", r.stderr  # the job's stdout untouched
    assert "fleetprof run: job sum-1" in r.stderr
    fields = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in r.stderr.splitlines()
                  if line.startswith("  ") and "  " in line.strip())
    assert fields["state"] == "finished (exit code 0)"
    assert re.fullmatch(r"[0-9.]+ (ms|s)", fields["duration"]), fields
    assert fields["peak GPU memory"].startswith("unknown")  # a CPU job: no NVML figure, never 0
    assert fields["report"] == f"{live_server}/api/v1/jobs/sum-1/report?format=html"

    failed = cli({**env, "FLEETPROF_DASHBOARD_URL": "http://dash.example:8050"}, "run", "--job-id", "sum/2",
                 "--no-hooks", "--format", "json", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert failed.returncode == 3, failed.stderr
    summary = json.loads(failed.stderr.strip().splitlines()[-1])
    assert summary["job_id"] == "sum/2" and summary["state"] == "failed" and summary["exit_code"] == 3
    assert summary["peak_used_bytes"] is None and summary["duration_s"] is not None
    assert summary["report_url"] == "http://dash.example:8050/jobs/sum%2F2"

    gone = {**env, "FLEETPROF_SERVER_URL": f"http://127.0.0.1:{free_port()}"}
    r = cli(gone, "run", "--job-id", "sum-3", "--no-hooks", "--", *job)
    assert r.returncode == 0 and r.stdout == "trained\n" and "fleetprof run: job sum-3" not in r.stderr


@pytest.mark.parametrize(("status", "code"), [
    (None, ExitCode.UNAVAILABLE), (408, ExitCode.UNAVAILABLE), (429, ExitCode.UNAVAILABLE),
    (500, ExitCode.UNAVAILABLE), (503, ExitCode.UNAVAILABLE), (404, ExitCode.NOT_FOUND), (401, ExitCode.AUTH),
    (403, ExitCode.AUTH), (400, ExitCode.REJECTED), (409, ExitCode.REJECTED), (413, ExitCode.REJECTED),
    (422, ExitCode.REJECTED),
])
def test_http_status_to_exit_code(status, code):
    from fleetprof.errors import exit_code_for_status

    assert exit_code_for_status(status) == code


def test_progress_draws_at_most_ten_times_a_second_and_ends_its_line():
    import io

    from fleetprof.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    now = [0.0]
    stream = Tty()
    with Progress("replay j", 1000, unit="samples", stream=stream, clock=lambda: now[0]) as bar:
        for done in range(1, 1001):
            now[0] += 0.001  # 1,000 updates in 1 s
            bar.update(done)
    drawn = stream.getvalue()
    assert 10 <= drawn.count("\r") <= 12 and drawn.endswith("100.0 % 1,000/1,000 samples\n")
    quiet = io.StringIO()  # not a terminal: nothing at all
    with Progress("replay j", 10, stream=quiet) as bar:
        bar.update(10)
    assert quiet.getvalue() == ""
