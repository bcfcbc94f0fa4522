"""experiments.ops.gpu_check.env, the launcher of ``make gpu-check``, in a simulated GPU machine: a fake
``nvidia-smi`` on the PATH, a faked device node, faked missing packages, this machine's CPU build of
torch, a fake interpreter standing for the GPU image's. Each refusal path and its exit code."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from experiments.ops.gpu_check import env as gpu_env

# the GPU check's launcher, in subprocesses, a GPU machine's tool: in CI after make test (make test-heavy)
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]
SMI = "#!/bin/sh\n[ \"$1\" = -L ] && echo 'GPU 0: NVIDIA H200 (UUID: GPU-00000000-fake)'\n"


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """machine(gpu=..., node=...): PATH holds only a fake bin folder (plus /bin for sh); the device node
    looked for is in tmp_path, present when ``node``."""

    def make(gpu: bool = True, node: bool = False) -> Path:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        smi = bin_dir / "nvidia-smi"
        if gpu:
            smi.write_text(SMI)
            smi.chmod(0o755)
        device = tmp_path / "nvidia0"
        if node:
            device.touch()
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/bin{os.pathsep}/usr/bin")
        monkeypatch.setenv("EAGLE2_NVIDIA_DEVICE", str(device))
        return tmp_path

    return make


def launch(tmp: Path, *args) -> int:
    return gpu_env.main(["--bundle", str(tmp / "bundle"), "--site", str(tmp / "site"), *args, "--prepare-only"])


def test_no_gpu_nothing_to_check(machine, capsys):
    tmp = machine(gpu=False)
    assert gpu_env.nvidia_gpus() == []
    assert gpu_env.main(["--bundle", str(tmp / "bundle"), "--site", str(tmp / "site")]) == 0  # no exec either
    assert "nothing to check" in capsys.readouterr().out


def test_gpu_found_by_nvidia_smi_or_device_node(machine):
    machine(gpu=True)
    assert gpu_env.nvidia_gpus() == ["GPU 0: NVIDIA H200 (UUID: GPU-00000000-fake)"]
    tmp = machine(gpu=False, node=True)
    (tmp / "bin" / "nvidia-smi").unlink()
    assert gpu_env.nvidia_gpus() == [f"device node {tmp / 'nvidia0'}"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs torch without CUDA")
def test_gpu_with_cpu_torch_exits_2(machine, capsys):
    assert launch(machine(gpu=True)) == gpu_env.NO_CUDA_TORCH == 2  # this machine's torch: a CPU build
    assert "torch cannot use it" in capsys.readouterr().err


def test_missing_package_exits_3(machine, monkeypatch, capsys):
    monkeypatch.setitem(gpu_env.NEEDED, "eagle2_absent_module", "eagle2-absent-dist")
    assert launch(machine(gpu=True)) == gpu_env.MISSING == 3
    assert "eagle2-absent-dist" in capsys.readouterr().err


def test_interpreter_without_site_packages_exits_3(machine, tmp_path, capsys):
    python = tmp_path / "bare-python"  # an interpreter that has none of the packages
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S -I \"$@\"\n")
    python.chmod(0o755)
    assert launch(machine(gpu=True), "--python", str(python)) == 3
    assert "torch" in capsys.readouterr().err


@pytest.mark.parametrize("wheel", ["torch-2.11.0-cp312-cp312-linux_x86_64.whl",
                                   "nvidia_cublas-13.0.0-py3-none-manylinux_2_27_x86_64.whl",
                                   "transformers-5.17.0-py3-none-any.whl", "triton-3.6.0-cp312-cp312-linux_x86_64.whl"])
def test_bundle_with_torch_or_cuda_wheels_exits_4(machine, wheel, capsys):
    tmp = machine(gpu=True)
    (tmp / "bundle").mkdir()
    (tmp / "bundle" / wheel).write_bytes(b"not used")
    assert launch(tmp) == gpu_env.BAD_BUNDLE == 4
    assert "refusing" in capsys.readouterr().err and not (tmp / "site").exists()


def pure_wheel(folder: Path, name: str) -> Path:
    """A minimal pure-Python wheel holding the module ``name``."""
    path = folder / f"{name}-0.1-py3-none-any.whl"
    files = {f"{name}/__init__.py": "VALUE = 1\n",
             f"{name}-0.1.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
             f"{name}-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                            "Tag: py3-none-any\n"}
    files[f"{name}-0.1.dist-info/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{name}-0.1.dist-info/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def fake_gpu_python(tmp: Path) -> Path:
    """An interpreter standing for the GPU image's: torch's probe says CUDA works; ``-m
    experiments.ops.gpu_check ARGS`` prints ARGS and exits 7; anything else is this Python."""
    python = tmp / "gpu-python"
    python.write_text("#!/bin/sh\n"
                      "case \"$2\" in *'import torch'*) echo '1 2.11.0+cu130 13.0 NVIDIA H200 (fake)'; exit 0;; esac\n"
                      "if [ \"$2\" = experiments.ops.gpu_check ]; then shift 2; echo \"CHECK ARGS: $*\"; exit 7; fi\n"
                      f"exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_bundle_installs_offline_and_missing_run_packages_are_only_named(machine, monkeypatch, capsys):
    tmp = machine(gpu=True)
    (tmp / "bundle").mkdir()
    pure_wheel(tmp / "bundle", "eagle2_bundled_fake")
    monkeypatch.setattr(gpu_env, "FOR_RUNS", {"eagle2_bundled_fake": "eagle2-bundled-fake",
                                              "eagle2_unbundled_fake": "eagle2-unbundled-fake"})
    assert launch(tmp, "--python", str(fake_gpu_python(tmp))) == 0
    out = capsys.readouterr().out
    assert (tmp / "site" / "eagle2_bundled_fake" / "__init__.py").exists()
    assert "note: eagle2-unbundled-fake missing" in out and "eagle2-bundled-fake missing" not in out
    assert "NVIDIA H200 (fake)" in out


def test_ready_machine_runs_the_check_with_its_exit_status(machine, tmp_path):
    tmp = machine(gpu=True)
    cmd = [sys.executable, "-m", "experiments.ops.gpu_check.env", "--bundle", str(tmp / "bundle"),
           "--site", str(tmp / "site"), "--python", str(fake_gpu_python(tmp)),
           "--", "--stages", "syncs", "--budget-s", "60"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr
    assert "CHECK ARGS: --stages syncs --budget-s 60" in done.stdout


def test_sentencepiece_is_declared_and_named_when_missing():
    """Vicuna's and LLaMA-2's tokenizers need sentencepiece: the gpu extra declares it, the launcher names it."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("sentencepiece") for req in extras["gpu"])
    assert gpu_env.FOR_RUNS["sentencepiece"] == "sentencepiece"


def test_gpu_env_installs_the_bundle_for_the_runs_and_names_what_is_missing(machine, monkeypatch, capsys):
    """make gpu-env (``--for-runs``): the bundle goes into the site whether or not a GPU is here; what run.py
    imports must then be found (a package in neither the Python nor the bundle: exit 3, named)."""
    tmp = machine(gpu=False)
    (tmp / "bundle").mkdir()
    pure_wheel(tmp / "bundle", "eagle2_bundled_fake")
    monkeypatch.setattr(gpu_env, "RUN_IMPORTS", ("eagle2_bundled_fake",))
    monkeypatch.setattr(gpu_env, "FOR_RUNS", {"eagle2_bundled_fake": "eagle2-bundled-fake",
                                              "eagle2_unbundled_fake": "eagle2-unbundled-fake"})
    args = ["--bundle", str(tmp / "bundle"), "--site", str(tmp / "site"), "--for-runs"]
    assert gpu_env.main(args) == 0
    assert (tmp / "site" / "eagle2_bundled_fake" / "__init__.py").exists()
    monkeypatch.setattr(gpu_env, "RUN_IMPORTS", ("eagle2_bundled_fake", "eagle2_unbundled_fake"))
    assert gpu_env.main(args) == gpu_env.MISSING
    assert "eagle2-unbundled-fake missing" in capsys.readouterr().err
