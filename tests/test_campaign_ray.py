"""`kvparity campaign --ray` (issue 32 item 4): 4 shards of the ci profile run as Ray tasks on a local Ray
runtime merge to the same verdict as the same 4 shards run separately (`python -m kvparity run --shard
i/4`, then `kvparity merge`); a campaign missing a shard is `error`. Skipped where ray is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvparity import cli

pytest.importorskip("ray", reason="ray is not installed (pip install 'kvparity[ray]')")

REPO = Path(__file__).resolve().parent.parent
ENGINE = "tests.fake_engine:FakeDictEngine"  # a FAKE engine: the campaign's own logic is under test


def _run_args(db: Path) -> list[str]:
    return ["--engine", ENGINE, "--profile", "ci", "--max-examples", "10", "--no-shrink", "--database", str(db)]


def _separately(tmp_path: Path) -> list[Path]:
    """The 4 shards as 4 plain `kvparity run --shard i/4` processes, as 4 CI jobs would run them."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-m", "kvparity", "run", *_run_args(tmp_path / "db-separate"),
                               "--shard", f"{i}/4", "--report-dir", str(tmp_path / "separate" / str(i)), "-q"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(1, 5)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    return [next((tmp_path / "separate" / str(i)).rglob("history.jsonl")).parent for i in range(1, 5)]


def _summary(results: dict) -> tuple:
    return (results["verdict"], {c: v["status"] for c, v in results["checks"].items()},
            [(s["shard"], s["seed"], s["examples"]) for s in results["campaign"]["shards"]])


def test_a_ray_campaign_merges_to_the_verdict_of_its_shards_run_separately(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code = cli.main(["campaign", "--shards", "4", "--ray", "--out", str(tmp_path / "ray"),
                     *_run_args(tmp_path / "db-ray")])
    captured = capsys.readouterr()
    printed = captured.out
    assert code == 0, printed
    assert all(f"shard {i}/4: 10/10 examples" in captured.err for i in range(1, 5)), captured.err  # via the board
    on_ray = json.loads((tmp_path / "ray" / "results.json").read_text())
    assert on_ray["campaign"]["count"] == 4 and len(on_ray["campaign"]["shards"]) == 4

    shard_dirs = _separately(tmp_path)
    code = cli.main(["merge", *map(str, shard_dirs), "--out", str(tmp_path / "separate-merged")])
    capsys.readouterr()
    separate = json.loads((tmp_path / "separate-merged" / "results.json").read_text())
    assert code == 0 and _summary(separate) == _summary(on_ray)

    ray_shards = sorted((tmp_path / "ray" / "shards").glob("*/*/*/history.jsonl"))
    code = cli.main(["merge", *[str(p.parent) for p in ray_shards[:3]], "--out", str(tmp_path / "three")])
    printed = capsys.readouterr().out
    assert code == 3 and "shard(s) 4/4 missing: 4 declared, 3 given" in printed, printed


def test_a_ray_address_that_takes_no_connection_is_refused_before_any_shard(tmp_path, capsys):
    """`ray.init` retries an unreachable cluster for as long as it runs (still trying after 5 minutes): the
    campaign tries the address itself first. The port of a socket just closed, so nothing listens there."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    code = cli.main(["campaign", "--shards", "2", "--ray", "--ray-address", f"127.0.0.1:{port}",
                     "--out", str(tmp_path / "c"), *_run_args(tmp_path / "db")])
    err = capsys.readouterr().err
    assert code == 3 and len(err.strip().splitlines()) == 1 and "cannot be reached" in err, err
    assert not (tmp_path / "c" / "shards").exists()


@pytest.mark.parametrize("form", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "auto"])
def test_a_ray_address_that_takes_a_connection_or_is_rays_own_word_passes_the_check(form):
    from conformance.campaign_ray import check_ray_address
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_ray_address(form.format(port=listening.getsockname()[1]))  # raises UsageError if refused


@pytest.mark.parametrize("option, value", [("--shard-gpus", "1.5"), ("--shard-gpus", "-1"), ("--shard-cpus", "nan"),
                                           ("--shard-cpus", "inf")])
def test_a_resource_ray_would_refuse_deep_inside_is_one_line_before_any_shard(option, value, tmp_path, capsys):
    code = cli.main(["campaign", "--shards", "1", "--ray", option, value, "--out", str(tmp_path / "c"),
                     *_run_args(tmp_path / "db")])
    err = capsys.readouterr().err
    assert code == 3 and len(err.strip().splitlines()) == 1 and option in err and "Traceback" not in err, err


def test_a_shard_asking_more_than_this_machine_has_is_refused_not_queued_for_ever(tmp_path):
    """Ray keeps an infeasible task queued for ever (`--shard-gpus 1` on a machine without a GPU hung the
    campaign): on the runtime the campaign starts itself, it says so in one line. A subprocess with a
    deadline, so the old behaviour fails instead of hanging the test run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "kvparity", "campaign", "--shards", "1", "--ray", "--shard-cpus",
                           "4096", "--out", str(tmp_path / "c"), *_run_args(tmp_path / "db")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3 and "--shard-cpus 4096: the Ray runtime on this machine has" in proc.stderr, \
        proc.stderr[-2000:]


def test_what_a_runtime_has_bounds_what_a_shard_may_ask():
    from conformance.campaign_ray import refuse_infeasible
    from conformance.contract import UsageError

    refuse_infeasible({"CPU": 2.0, "GPU": 1.0}, 2, 1)  # all of it: feasible
    with pytest.raises(UsageError, match="--shard-gpus 1: .* has 0 GPU"):
        refuse_infeasible({"CPU": 2.0}, 1, 1)


def test_a_ray_task_that_fails_is_a_shard_without_a_run_folder_not_a_lost_campaign():
    """`run_shard` raising on its node (here: a report folder it cannot make) used to reach the campaign as
    ray.get's exception — every shard's outcome lost, no merged report. On a Ray runtime the caller started
    (a program driving campaigns in-process), which the campaign uses as it is."""
    import ray

    from conformance.campaign_ray import run_ray

    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        [outcome], stopped = run_ray([["-c", "pass"]], [Path("/proc/kvparity-shard")], 1, 0)
    finally:
        ray.shutdown()
    assert stopped is None and outcome["run_dir"] is None and outcome["tail"].startswith("the Ray task failed:")
    assert "kvparity-shard" in outcome["tail"], outcome["tail"]


def test_a_shard_folder_on_a_disk_the_driver_does_not_see_is_sent_back(tmp_path):
    """A Ray cluster's nodes need not share the driver's files: a shard writes its run folder at the same
    path on its node, and its task sends it back (`packed`), written where the driver misses it
    (`gathered`). Here the task's side runs a real shard (`run_shard`, no Ray: its logic is under test),
    then its folder is moved away, as if it were on another node's disk; what is gathered merges (the
    history verified, sealed) to the shard's own verdict."""
    from conformance.campaign_ray import gathered, run_shard

    folder = tmp_path / "out" / "shards" / "1"
    argv = ["-m", "kvparity", "run", *_run_args(tmp_path / "db"), "--shard", "1/1", "--report-dir", str(folder), "-q"]
    result = run_shard(argv, str(folder), str(REPO))
    assert result["exit"] == 0 and result["run_dir"], result["tail"]
    folder.rename(tmp_path / "node-disk")  # the driver sees none of it
    assert cli.main(["merge", result["run_dir"], "--out", str(tmp_path / "before")]) == 3

    gathered(result, folder)
    assert (folder / "console.log").is_file()
    assert cli.main(["merge", result["run_dir"], "--out", str(tmp_path / "merged")]) == 0
    assert "files" not in result


@pytest.mark.parametrize("name", ["../outside.txt", "/tmp/kvparity-absolute.txt"])
def test_what_a_shard_task_sends_cannot_write_outside_its_folder(tmp_path, name):
    import io
    import tarfile

    from conformance.campaign_ray import gathered

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    folder = tmp_path / "shards" / "1"
    folder.mkdir(parents=True)
    with pytest.raises(ValueError, match="not a file of its run folder"):
        gathered({"exit": 0, "run_dir": None, "tail": "", "files": buffer.getvalue()}, folder)
    assert not (tmp_path / "shards" / "outside.txt").exists() and not Path("/tmp/kvparity-absolute.txt").exists()


def test_each_shard_gets_the_devices_ray_gave_its_task(tmp_path):
    """`--shard-gpus 1`: Ray gives each task a GPU of its own (CUDA_VISIBLE_DEVICES in the task's worker);
    the shard must see that one. It was started with the campaign's environment, so it saw every GPU of
    its node and each engine took the first. Two logical GPUs on this CPU machine: the assignment is
    Ray's, real, without the hardware."""
    import ray

    from conformance.campaign_ray import run_ray

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        show = ["-c", "import os; print('devices', os.environ.get('CUDA_VISIBLE_DEVICES'))"]
        outcomes, stopped = run_ray([show, show], [tmp_path / "1", tmp_path / "2"], 1, 1)
    finally:
        ray.shutdown()
    seen = sorted(o["tail"].split()[-1] for o in outcomes)
    assert stopped is None and seen == ["0", "1"], [o["tail"] for o in outcomes]


def test_a_shard_whose_campaign_board_is_lost_is_stopped_with_a_report(tmp_path):
    """The campaign's `Board` gone (its driver died, and the actor with it): the task cannot hear a stop any
    more, so it stops its shard as a stopped campaign would (SIGTERM: an INTERRUPTED report), rather than
    drive the engine on with no one to merge it. Run here in-process against a real actor, killed mid-run."""
    import threading

    import ray

    from conformance.campaign_ray import Board, run_shard

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        board = ray.remote(Board).remote()
        folder = tmp_path / "1"
        argv = ["-m", "kvparity", "run", "--engine", ENGINE, "--profile", "nightly", "--max-examples", "100000",
                "--no-shrink", "--database", str(tmp_path / "db"), "--shard", "1/1", "--report-dir", str(folder)]
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(run_shard(argv, str(folder), str(REPO), board, 0)))
        worker.start()
        for _ in range(600):
            if any('"event":"example"' in p.read_text() for p in folder.glob("*/*/history.jsonl")):
                break
            worker.join(0.1)
        ray.kill(board)
        worker.join(120)
    finally:
        ray.shutdown()
    assert not worker.is_alive() and result["exit"] == 143, result.get("tail")
    history = Path(result["run_dir"]) / "history.jsonl"
    assert '"event":"interrupted"' in history.read_text()


def _processes() -> dict[int, tuple[int, str]]:
    """Every process's parent and command line: pid -> (ppid, cmdline)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        found[int(stat.parent.name)] = (ppid, cmdline)
    return found


def _campaign_whose_worker_dies(tmp_path: Path) -> tuple[Path, int, str]:
    """A one-shard Ray campaign (nightly, long) whose shard's task worker is SIGKILLed once the shard has
    recorded 400 examples (its report then takes ~0.9 s); the campaign folder, exit code and output, once
    the shard's processes are gone."""
    import signal
    import time

    out = tmp_path / "c"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    campaign = subprocess.Popen([sys.executable, "-m", "kvparity", "campaign", "--shards", "1", "--ray", "--out", str(out),
                                 "--engine", ENGINE, "--profile", "nightly", "--max-examples", "100000", "--no-shrink",
                                 "--database", str(tmp_path / "db")],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and campaign.poll() is None:
            histories = list(out.glob("shards/1/*/*/history.jsonl"))
            if histories and histories[0].read_text().count('"event":"example"') >= 400:  # a report of some length
                break
            time.sleep(0.2)
        procs = _processes()
        shard = [pid for pid, (ppid, cmd) in procs.items() if str(out) in cmd and " run " in cmd
                 and procs.get(ppid, (0, ""))[1].startswith("ray::run_shard")]
        assert len(shard) == 1, f"no shard under a Ray worker (campaign exit {campaign.poll()})"
        os.kill(procs[shard[0]][0], signal.SIGKILL)  # the shard's task worker
        printed, _ = campaign.communicate(timeout=120)
        deadline = time.monotonic() + 60
        while any(str(out) in cmd for _, cmd in _processes().values()) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if campaign.poll() is None:
            campaign.kill()
        for pid, (_, cmd) in _processes().items():
            if str(out) in cmd:
                os.kill(pid, signal.SIGKILL)
    return out, campaign.returncode, printed


LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shards' parent-death signal is Linux's")


@LINUX_ONLY
def test_a_shard_whose_ray_worker_dies_ends_its_run_with_a_report_and_is_merged(tmp_path):
    """A Ray task's worker killed under its shard (Ray's memory monitor, the OOM killer): Ray 2.60's raylet
    then sends SIGTERM to the worker's process group and SIGKILL 200 ms later, whatever
    `kill_child_processes_on_worker_exit` says. The shard was in that group: its history ended
    `interrupted`, cut before its report (no results.json). In a group of its own, its parent-death SIGTERM
    ends its run with a report, as a killed campaign's shards end theirs. And though its task failed in Ray,
    the shard ended its run in a folder this machine sees: the campaign merges it (error: interrupted, with
    what it recorded and found), as a local campaign merges a shard killed under it, instead of calling it
    "left no run folder" and leaving its examples out of the merged report."""
    out, code, printed = _campaign_whose_worker_dies(tmp_path)
    assert code == 3, printed[-2000:]
    (history,) = out.glob("shards/1/*/*/history.jsonl")
    assert '"event":"interrupted","cause":"SIGTERM' in history.read_text()
    results = json.loads((history.parent / "results.json").read_text())
    assert results["verdict"] == "error" and results["interrupted"], results.get("errors")
    merged = json.loads((out / "results.json").read_text())
    assert [s["run_dir"] for s in merged["campaign"]["shards"]] == [str(history.parent)], printed[-2000:]
    assert merged["verdict"] == "error" and merged["examples"] >= 400
    assert "left no run folder" not in printed and "its process's end was not seen" in printed, printed[-2000:]
