"""The benchmark harness: named experiments, sweeps that survive a kill, failed cells, the SLURM launcher.

The sweeps run ``python run.py -m`` in a subprocess on the real SmolLM2 with a random tiny EAGLE head.
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis.metrics import iter_rows, load_failures
from analysis.report import build_report
from eagle2.heads.eagle_head import save_head
from experiments.research.recipe import EXPERIMENTS, commands
from tests.conftest import tiny_head, unloadable_weights

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "EAGLE2_TEST_THREADS": "1"}
COMMON = ["logger=none", "threads=1", "warmup_tokens=0", "dataset=nq", "max_new_tokens=4"]


def compose_cfg(*overrides, hydra_cfg: bool = False):
    from eagle2.bench.resolvers import register

    register()  # (run.py registers them; this file may run before anything else imports eagle2.bench)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


def read_rows(folder: Path) -> list[dict]:
    """Every complete row under ``folder`` (a line cut by a kill is skipped, as the store does)."""
    return list(iter_rows(folder))


def run_py(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def head_dir(smollm2, tmp_path_factory):
    head = tiny_head(smollm2[0])
    head.draft_vocab = torch.arange(smollm2[0].config.vocab_size)  # serves any method.draft_vocab_size
    return save_head(head, tmp_path_factory.mktemp("head") / "head")


@pytest.mark.parametrize("name", EXPERIMENTS)  # every conf/experiment/*.yaml, found by glob
def test_experiment_sweeps_and_scales(name):
    """Small on CPU (SmolLM2); the paper's protocol once only the model is overridden (GPU recipe)."""
    assert (CONF / "experiment" / f"{name}.yaml").read_text().startswith("# @package _global_")
    cpu = compose_cfg(f"experiment={name}", hydra_cfg=True)
    params = OmegaConf.to_container(cpu.hydra.sweeper.params)
    assert params and all(isinstance(v, str) and v for v in params.values())  # a sweep, not a single run
    assert cpu.paths.results == f"results/{name}" and cpu.logger.name == "none"
    assert 1 <= cpu.dataset.limit <= 10 and cpu.max_new_tokens == 64  # batch_scaling: 10 (20 turns > B=8)
    if name == "fig1":
        assert cpu.temperature == 1.0 and cpu.dataset.name == "mt_bench"
        assert params == {"method": "plain,sps,eagle,eagle2"}
    for value in params.get("method", "").split(","):  # every swept choice exists
        assert (CONF / "method" / f"{value}.yaml").is_file()
    for value in params.get("dataset", "").split(",") if "dataset" in params else []:
        assert (CONF / "dataset" / f"{value}.yaml").is_file()

    gpu = compose_cfg(f"experiment={name}", "model=vicuna7b", "dataset=gsm8k")
    assert gpu.model.device == "cuda" and gpu.dataset.limit is None
    assert gpu.max_new_tokens == gpu.model.max_new_tokens == 512  # the authors' limit (eagenerate's default)
    assert gpu.method.total_tokens == 59  # the authors' tree for Vicuna-7B (their total_token 60) unless swept
    one_cell = compose_cfg(f"experiment={name}", *[f"{k}={v.split(',')[0]}" for k, v in params.items()])
    OmegaConf.to_container(one_cell, resolve=True)  # every interpolation of a cell resolves


def test_table1_is_the_full_grid():
    params = compose_cfg("experiment=table1", hydra_cfg=True).hydra.sweeper.params
    assert params.method == "plain,sps,pld,eagle,eagle2,oracle" and params.lookup_branch == "false,true"
    assert math.prod(len(v.split(",")) for v in params.values()) == 6 * 2 * 6 * 2  # x lookup branch off/on


@pytest.mark.slow  # run.py sweeps in a subprocess, several cells on SmolLM2
@pytest.mark.entrypoint
def test_named_experiment_sweeps_its_cells(tmp_path):
    """``python run.py -m experiment=fig1`` really launches one job per method, at temperature 1."""
    out = run_py("-m", "experiment=fig1", "dataset.limit=0", f"paths.results={tmp_path / 'r'}",
                 f"hydra.sweep.dir={tmp_path / 'multirun'}")
    assert out.returncode == 0, out.stderr
    started = [line for line in out.stdout.splitlines() if line.startswith("[eagle2] summary")]
    assert len(started) == 4 and all("T=1.0" in line for line in started)
    assert {line.split("/")[1] for line in started} == {"plain", "sps", "eagle", "eagle2"}


@pytest.mark.slow  # run.py sweeps in a subprocess, several cells on SmolLM2
@pytest.mark.entrypoint
def test_killed_sweep_resumes_without_redoing_or_duplicating_rows(tmp_path, head_dir):
    results = tmp_path / "r"
    args = [sys.executable, "run.py", "-m", "method=plain,eagle2", "dataset.limit=3", *COMMON,
            f"paths.results={results}", f"model.head={head_dir}", "model.eagle2.total_tokens=4",
            "model.eagle2.depth=2", "model.eagle2.top_k=2", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    total = 2 * 3  # two methods x three single-turn questions
    proc = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 240
        while not read_rows(results) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = read_rows(results)
    assert 1 <= len(before) < total, "the sweep must be killed midway"

    again = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    after = read_rows(results)
    keys = [(r["config_hash"], r["question_id"], r["turn"]) for r in after]
    assert len(keys) == len(set(keys)) == total  # all present, none twice
    assert {r["method"] for r in after} == {"plain", "eagle2"} and all(r["status"] == "ok" for r in after)
    by_key = {(r["config_hash"], r["question_id"], r["turn"]): r for r in after}
    for row in before:  # a row finished before the kill is kept as it was, not redone
        assert by_key[(row["config_hash"], row["question_id"], row["turn"])] == row
    to_run = sum(int(line.split(", ")[1].split()[0]) for line in again.stdout.splitlines()
                 if line.startswith("[eagle2]") and "turns to run" in line)
    assert to_run == total - len(before)


@pytest.mark.slow  # run.py sweeps in a subprocess, several cells on SmolLM2
@pytest.mark.entrypoint
def test_failed_cell_is_recorded_and_the_sweep_goes_on(tmp_path):
    results = tmp_path / "r"
    missing = unloadable_weights(tmp_path / "no_such_head")  # passes the checks before loading, not the loader
    out = run_py("-m", "method=eagle2,plain", "dataset.limit=1", *COMMON, f"paths.results={results}",
                 f"model.head={missing}", f"hydra.sweep.dir={tmp_path / 'multirun'}")
    assert out.returncode == 0, out.stderr
    assert "[eagle2] run failed" in out.stdout and "the sweep goes on" in out.stdout
    rows = read_rows(results)
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["method"] == "eagle2"
    assert failed[0]["question_id"] is None and failed[0]["turn"] is None and failed[0]["scope"] == "cell"
    assert str(missing) in failed[0]["error"] and "Traceback" in failed[0]["traceback"]
    assert [r["method"] for r in rows if r["status"] == "ok"] == ["plain"]  # the next cell still ran
    standing = load_failures(results)
    assert list(standing.scope) == ["cell"] and list(standing.method) == ["eagle2"]
    build_report(results, tmp_path / "report")
    assert "Failed cells, not in the table (errors in summary.md): eagle2 on nq" in (
        tmp_path / "report" / "table1.md").read_text()
    assert str(missing) in (tmp_path / "report" / "summary.md").read_text()


@pytest.mark.entrypoint  # run.py in a subprocess
def test_single_run_failure_exits_nonzero_with_one_message(tmp_path):
    out = run_py("method=sps", "dataset.limit=1", *COMMON, f"paths.results={tmp_path}",
                 f"model.sps_draft={unloadable_weights(tmp_path / 'no_draft')}", f"hydra.run.dir={tmp_path / 'hydra'}")
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if "run failed" in line]
    assert len(errors) == 1 and errors[0].startswith("[eagle2] run failed:") and "no_draft" in errors[0]
    assert "Traceback" not in out.stderr
    failed = read_rows(tmp_path)
    assert len(failed) == 1 and failed[0]["status"] == "failed" and failed[0]["method"] == "sps"


def test_slurm_launcher_config():
    path = CONF / "hydra" / "launcher" / "slurm.yaml"
    raw = yaml.safe_load(path.read_text())
    assert raw["defaults"] == ["submitit_slurm"]
    assert {"timeout_min", "gpus_per_node", "cpus_per_task", "mem_gb", "partition", "array_parallelism"} <= set(raw)
    try:  # find_spec raises when even the hydra_plugins namespace is absent
        installed = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except ModuleNotFoundError:
        installed = False
    if not installed:
        pytest.skip("hydra-submitit-launcher not installed (pip install -e .[slurm]); YAML checked only")
    cfg = compose_cfg("experiment=table1", "model=vicuna7b", "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                      hydra_cfg=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.partition == "gpu" and launcher.gpus_per_node == 1 and launcher.timeout_min == raw["timeout_min"]
    assert cfg.hydra.sweeper.params.method == "plain,sps,pld,eagle,eagle2,oracle"  # the experiment's sweep is kept


def test_recipe_commands():
    cmds = commands("tree_budget", ["model=vicuna7b"], None, "report/tree_budget")
    assert [c[1:4] for c in cmds[:2]] == [["run.py", "-m", "experiment=tree_budget"]] * 2
    assert "method=plain" in cmds[1] and "hydra.sweeper.params=null" in cmds[1] and "model=vicuna7b" in cmds[1]
    assert cmds[2][1:] == ["-m", "analysis.report", "results/tree_budget", "--out", "report/tree_budget"]
    table1 = commands("table1", [], "/tmp/r", None)
    assert len(table1) == 1 and table1[0][-1] == "paths.results=/tmp/r"


@pytest.mark.heavy  # run.py in a subprocess: in CI; the refusal in-process: test_results_store (second writer)
def test_second_writer_cli_refuses_with_one_line_naming_the_first(tmp_path):
    from eagle2.results.store import ResultStore, config_hash

    overrides = ["method=plain", "dataset.limit=1", *COMMON, f"paths.results={tmp_path}"]
    cfg = compose_cfg(*overrides)
    with ResultStore.for_config(cfg, config_hash(cfg)) as first:  # this process is the first writer
        out = run_py(*overrides, f"hydra.run.dir={tmp_path / 'hydra'}")
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if "run failed" in line]
    assert len(errors) == 1 and f"being written by pid {os.getpid()}" in errors[0] and "Traceback" not in out.stderr
    assert not first.rows_path.exists() and read_rows(tmp_path) == []


def test_equal_budgets_pairs_a_static_and_a_dynamic_tree_of_each_budget():
    from eagle2.core.tree import choice_paths
    from eagle2.results.store import config_hash

    cmds = commands("equal_budgets", [], None, None)
    assert len(cmds) == 3
    static_run = [c for c in cmds[1][3:] if not c.startswith("hydra.")]  # the run's own overrides
    cfg = compose_cfg(*static_run)
    paths = [list(p) for p in OmegaConf.to_container(cfg, resolve=True)["method"]["choices"]]
    assert len(choice_paths(paths)) == 60  # a valid tree (parents first) of 60 drafted nodes
    base = OmegaConf.to_container(OmegaConf.load(CONF / "model" / "_base.yaml").mc_sim_7b_63)
    assert paths == base[:60]  # the first 60 nodes of mc_sim_7b_63
    literal = "[" + ",".join("[" + ",".join(map(str, p)) + "]" for p in base[:60]) + "]"
    spelled_out = compose_cfg(*[f"method.choices={literal}" if c.startswith("method.choices=") else c
                                for c in static_run])
    assert config_hash(cfg) == config_hash(spelled_out)  # results written before the YAML held it keep their hash
    assert "model.eagle2.total_tokens=60" in cmds[2] and all("model.dtype=float32" in c for c in cmds[1:])
    grid = OmegaConf.to_container(compose_cfg("experiment=equal_budgets", hydra_cfg=True).hydra.sweeper.params)
    assert grid["model.eagle2.total_tokens"] == "25" and grid["model.dtype"] == "float32"
    assert len(compose_cfg("method=eagle").method.choices) == 25  # the static tree the 25-node grid runs
