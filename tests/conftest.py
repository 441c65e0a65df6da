"""Shared test fixtures: the real wheel, installed in a real virtual environment.

By default a venv with torch 2.13 (CPU) is made once and cached under ``.cache/`` (or
``ROCM_AUTOPATCH_TEST_VENV``). ``ROCM_AUTOPATCH_TEST_TORCH_VENV=/path/to/venv`` runs the
suite against the torch of an existing venv instead: it is used as it is (torch is never
installed, upgraded or removed there; tests that need a package it lacks, transformers
say, skip and say so). Either way each session builds the wheel from this checkout and
reinstalls it there, so every subprocess test runs the real .pth from site-packages, and
expected values come from the torch in that venv (``Venv.torch``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH_PIN = "torch==2.13.0"
TORCH_VENV_ENV = "ROCM_AUTOPATCH_TEST_TORCH_VENV"  # the switch: test another torch
# Variables that would change what rocm-autopatch or torch do; tests set them explicitly.
SCRUB = ("ROCM_AUTOPATCH", "TORCHINDUCTOR_", "INDUCTOR_", "PYTHONPATH", "TORCH_COMPILE",
         "RANK", "LOCAL_RANK", "PYTHONSTARTUP")


# The user's cache directory of every test process: repros and remembered fixes written by
# one test must not heal another test's graph, nor stay in the real ~/.cache.
CACHE_HOME = tempfile.mkdtemp(prefix="rocm-autopatch-tests-cache-")
atexit.register(shutil.rmtree, CACHE_HOME, True)  # 128 of them were left in /tmp here


def dynamo_graph(fn, *args):  # type: ignore[no-untyped-def]
    """The FX graph Dynamo makes of ``fn`` on ``args`` (what the sentinel's Graph holds),
    compiled in this process with a backend that keeps it."""
    import torch

    found: list = []

    def backend(gm, example_inputs):  # type: ignore[no-untyped-def]
        found.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=backend, fullgraph=True)(*args)
    finally:
        torch._dynamo.reset()
    return found[0]


def named_in_cache_key(bug: str) -> str:
    """Child code that makes Inductor's caches tell a graph compiled with an injected bug
    (a patched decomposition, which no cache key holds) from the same graph compiled without
    it or with another: a post-grad pass that changes nothing, whose uuid is the bug's text
    (a custom pass's uuid is part of the FX-graph and AOT-autograd cache keys from torch
    2.6, PR 137298, ``torch/_inductor/custom_graph_pass.py``; before it the child turns the
    caches off, as these tests did). So such a test keeps the caches on: with them off a
    process compiles every kernel again in a fresh directory and probes the CPU's vector
    instructions again (about 12 CPU s of g++ here, each time)."""
    return ("import torch._inductor.config as _config\n"
            "try:\n"
            "    from torch._inductor.custom_graph_pass import CustomGraphPass as _Pass\n"
            "except ImportError:  # torch before 2.6: no pass in the keys, so no caches\n"
            "    _config.force_disable_caches = True\n"
            "else:\n"
            "    class _NamedBug(_Pass):  # the injected bug, named in Inductor's cache keys\n"
            "        def __call__(self, graph):\n"
            "            pass\n"
            "        def uuid(self):\n"
            f"            return {('rocm-autopatch test bug: ' + bug)!r}\n"
            "    _config.post_grad_custom_post_pass = _NamedBug()\n")


VEC_ISA_OK = "TORCHINDUCTOR_VEC_ISA_OK"


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUB)}
    env["PYTHONUNBUFFERED"] = "1"
    env["XDG_CACHE_HOME"] = CACHE_HOME
    # A test that falls back does not start a bisection at exit unless it asks for one.
    env["ROCM_AUTOPATCH_VERIFY_BISECT"] = "0"
    # Nor does it start its graphs' ladders at rungs another test's process passed (one
    # cache directory serves a worker's tests): only the tests of the store ask for one.
    env["ROCM_AUTOPATCH_RUNGS"] = "off"
    # Inductor's first CPU compile in a process builds a probe library per vector ISA the CPU
    # names and loads each in a child Python (torch/_inductor/cpu_vec_isa.py, _probe_load):
    # ~1.7 CPU s of a small compile's 6.4 (tests/guards: 229 CPU s against 241). Set,
    # Inductor takes the ISAs /proc/cpuinfo names as they are: the same kernels where the
    # probes pass, as they do on this machine and CI's. The doctor lists it, as it would a
    # user's.
    env[VEC_ISA_OK] = "1"
    env.update(extra)
    return env


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.python = str(path / "bin" / "python")
        out = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True)
        self.site = Path(out.stdout.strip())
        # What the last torchrun killed at its timeout had printed (stdout, stderr), for a
        # test whose job should have finished to say where it stopped
        self.timed_out: Tuple[str, str] = ("", "")

    def run(self, code: str, *args: str, env: Optional[Dict[str, str]] = None,
            flags: List[str] = (), timeout: int = 600, cwd: Optional[str] = None
            ) -> subprocess.CompletedProcess:
        # Not from the checkout: `-c` puts the working directory first on sys.path, and the
        # source tree's package would shadow the installed wheel.
        return subprocess.run([self.python, *flags, "-c", code, *args], capture_output=True,
                              text=True, env=clean_env(**(env or {})), timeout=timeout,
                              cwd=cwd or str(self.path))

    def torchrun(self, *args: str, env: Dict[str, str], cwd: str, timeout: int = 300
                 ) -> Optional[subprocess.CompletedProcess]:
        """``torchrun *args`` in a session of its own; None when it runs past ``timeout``,
        and then torchrun and every rank are killed (a hung rank is never left behind:
        torch's elastic agent starts each rank in a session of its own, so killing
        torchrun's group alone left two hung ranks holding the pipes, and the test
        waited for them until pytest's own limit)."""
        proc = subprocess.Popen([str(self.path / "bin" / "torchrun"), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=cwd, env=clean_env(**env), start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid, *descendants(proc.pid)]:
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self.timed_out = proc.communicate()
            return None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    @functools.cached_property
    def torch(self) -> Dict[str, object]:
        """The torch under test: version (major, minor), its string, its build."""
        code = ("import json, torch; v = torch.version; print(json.dumps({'version': "
                "torch.__version__, 'build': 'rocm' if v.hip else 'cuda' if v.cuda else 'cpu'}))")
        found = self.json(code, env={"ROCM_AUTOPATCH": "0"})
        major, minor = found["version"].split(".")[:2]
        return {**found, "release": (int(major), int("".join(c for c in minor if c.isdigit())))}

    def has(self, module: str) -> bool:
        """Whether ``module`` is installed in this venv: found by its interpreter, not
        imported (an import of transformers was about 3 CPU s a test)."""
        code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        return self.run(code, env={"ROCM_AUTOPATCH": "0"}).returncode == 0

    def needs(self, module: str) -> None:
        if not self.has(module):
            pytest.skip(f"{module} is not installed in the torch venv under test ({self.path})")

    def json(self, code: str, *args: str, **kwargs) -> dict:
        """Run ``code``; its last stdout line is JSON. Fails with stderr on a crash."""
        proc = self.run(code, *args, **kwargs)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])


def descendants(pid: int) -> List[int]:
    """The processes below ``pid`` (its children, theirs...), from ``/proc``."""
    parents: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the fields after the command's closing parenthesis: state, ppid, ...
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def rank_lines(stdout: str) -> List[dict]:
    """The ``{"rank": ...}`` JSON objects a torchrun job printed, by rank (the ranks'
    lines can run together on one pipe)."""
    found, text, decoder = [], stdout, json.JSONDecoder()
    while '{"rank"' in text:
        text = text[text.index('{"rank"'):]
        value, end = decoder.raw_decode(text)
        found.append(value)
        text = text[end:]
    return sorted(found, key=lambda r: r["rank"])


def doctor(venv_: Venv, *args: str, env: Optional[Dict[str, str]] = None
           ) -> subprocess.CompletedProcess:
    """``rocm-autopatch doctor *args`` as installed in ``venv_`` (run from the venv, so that
    no checkout shadows the installed package)."""
    return subprocess.run([str(venv_.path / "bin" / "rocm-autopatch"), "doctor", *args],
                          capture_output=True, text=True, env=clean_env(**(env or {})),
                          timeout=600, cwd=str(venv_.path))


def fake_kfd(root: Path, target: int) -> str:
    """A FAKE KFD topology (stands for an AMD GPU, which no machine here has): a CPU node and
    one GPU of gfx target ``target`` (90402: gfx942)."""
    (root / "0").mkdir(parents=True)
    (root / "0" / "properties").write_text("gfx_target_version 0\n")
    (root / "1").mkdir()
    (root / "1" / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {target}\n")
    return str(root)


def flat(text: str) -> str:
    """Doctor text with its 80-column wrapping undone (where it wraps depends on how deep
    the temporary directory is)."""
    return " ".join(text.split())


def pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *args], check=True, env=clean_env())


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One pytest-xdist worker at a time (each worker is a session of its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def source_digest() -> str:
    """What the wheel is built from (README.md is its long description): rebuild and
    reinstall when, and only when, this changed."""
    digest = hashlib.sha256()
    files = [ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "_rocm_autopatch_start.py",
             ROOT / "rocm_autopatch.pth", ROOT / "rocm_autopatch.start",
             *sorted((ROOT / "rocm_autopatch").rglob("*.py"))]
    for file in files:
        digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    try:  # the build backend writes its version into the wheel
        digest.update(importlib.metadata.version("hatchling").encode())
    except importlib.metadata.PackageNotFoundError:  # not here: the files decide alone
        pass
    return digest.hexdigest()


@pytest.fixture(scope="session")
def wheel() -> Path:
    """The wheel of this checkout, built once per source digest for all of a run's workers
    (each pytest-xdist worker is a session of its own: three workers built three)."""
    out = ROOT / ".cache" / "wheels" / source_digest()[:16]
    with locked(out):
        if not list(out.glob("rocm_autopatch-*.whl")):
            building = out.with_name(out.name + ".part")
            shutil.rmtree(building, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(building), str(ROOT)],
                           check=True, env=clean_env())
            shutil.rmtree(out, ignore_errors=True)
            building.rename(out)
    (found,) = out.glob("rocm_autopatch-*.whl")
    return found


def runners_own(packages: List[str]) -> Optional[Path]:
    """The site-packages of the interpreter running pytest where it holds every one of
    ``packages`` as pinned (``name==version``, a local tag such as ``+cpu`` allowed) or at
    all (a bare name): what the README's test command just installed with ``.[test]``."""
    sites = set()
    for spec in packages:
        name, _, pinned = spec.partition("==")
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        if pinned and dist.version.split("+")[0] != pinned:
            return None
        sites.add(Path(dist.locate_file("")).resolve())
    return sites.pop() if len(sites) == 1 else None  # one site-packages holds them all


def link_site(source: Path, target: Path) -> None:
    """Every entry of ``source`` linked into ``target``, but for rocm-autopatch's own files
    (the wheel under test is installed there), start-up files (``.pth``), ``__pycache__``
    (a byte-compiled file of the new venv's would land in the runner's) and what the new
    venv has already (its pip and setuptools, whatever their versions there)."""
    own = {_project(e.name) for e in target.iterdir() if e.suffix == ".dist-info"}
    for entry in source.iterdir():
        if (entry.name.startswith(("rocm_autopatch", "_rocm_autopatch"))
                or entry.suffix == ".pth" or entry.name == "__pycache__"
                or (target / entry.name).exists()
                or entry.suffix == ".dist-info" and _project(entry.name) in own):
            continue
        (target / entry.name).symlink_to(entry)


def _project(dist_info: str) -> str:
    """The project a ``NAME-VERSION.dist-info`` folder is of, normalised."""
    return dist_info.split("-")[0].lower().replace("_", "-")


def link_scripts(source: Path, venv_path: Path) -> None:
    """The console scripts of the distributions in ``source`` (``torchrun``, transformers'
    CLI), written into the venv's ``bin`` for its own interpreter, as pip writes them: the
    runner's own would start the runner's interpreter."""
    python = venv_path / "bin" / "python"
    for dist in importlib.metadata.distributions(path=[str(source)]):
        for entry in dist.entry_points:
            script = venv_path / "bin" / entry.name
            if entry.group != "console_scripts" or script.exists() or not entry.attr:
                continue
            top = entry.attr.split(".")[0]
            script.write_text(f"#!{python}\nimport sys\nfrom {entry.module} import {top}\n"
                              f"if __name__ == '__main__':\n    sys.exit({entry.attr}())\n")
            script.chmod(0o755)


def make_venv(path: Path, packages: List[str]) -> None:
    """A venv holding ``packages``. Where pytest's own interpreter has them (CI, a
    newcomer's first run: the test command installed them a minute before) they are linked
    from there rather than installed again: pip's second install of torch and transformers
    was about 40 CPU s of the suite's 1,900 on the 2-core machine (issue 42)."""
    marker = path / ".ready"
    seed = runners_own(packages) if packages else None
    wanted = " ".join(packages) + (f" linked from {seed} with its scripts, once" if seed else "")
    # A linked venv whose source went (its links dangle) is made again.
    if marker.exists() and marker.read_text() == wanted and (
            seed is None or (_site(path) / "torch").exists()):
        return
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    if seed:
        link_site(seed, _site(path))
        link_scripts(seed, path)
    elif packages:
        pip(str(path / "bin" / "python"), *packages)
    marker.write_text(wanted)


def _site(path: Path) -> Path:
    """The purelib of the venv at ``path`` (made by this interpreter's version)."""
    return path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


@pytest.fixture(scope="session")
def torch_venv(wheel: Path) -> Iterator[Venv]:
    """The venv under test, with this checkout's wheel: the cached torch 2.13 venv, or the
    one ``ROCM_AUTOPATCH_TEST_TORCH_VENV`` names, used as it is."""
    given = os.environ.get(TORCH_VENV_ENV, "").strip()
    if given:
        path = Path(given).absolute()
        if not (path / "bin" / "python").exists():
            pytest.exit(f"{TORCH_VENV_ENV}={given}: no bin/python there", returncode=2)
    else:
        path = Path(os.environ.get("ROCM_AUTOPATCH_TEST_VENV", ROOT / ".cache" / "venv-torch"))
    with locked(path):
        if not given:
            make_venv(path, [TORCH_PIN, "numpy", "transformers", "expecttest"])
        # Reinstalled only when the source changed: under xdist, a second worker must not
        # pull the package out from under the first one's running tests.
        marker, digest = path / ".rocm_autopatch_installed", source_digest()
        if not marker.exists() or marker.read_text() != digest:
            pip(str(path / "bin" / "python"), "--force-reinstall", "--no-deps", str(wheel))
            marker.write_text(digest)
    yield Venv(path)


@pytest.fixture(scope="session")
def torch_links(torch_venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch and its dependencies, without rocm-autopatch: links into the torch venv."""
    links = tmp_path_factory.mktemp("torch-links")
    for entry in torch_venv.site.iterdir():
        if entry.name.startswith(("rocm_autopatch", "_rocm_autopatch")) or entry.suffix == ".pth":
            continue
        (links / entry.name).symlink_to(entry)
    return links


def new_venv(path: Path, links: Path, *, system_site: bool = False) -> Venv:
    """A venv of its own (tests that change site-packages) that sees torch via ``links``."""
    venv.EnvBuilder(with_pip=False, system_site_packages=system_site, symlinks=True).create(path)
    env = Venv(path)
    (env.site / "torch_links.pth").write_text(f"{links}\n")  # a path line: runs no code
    return env


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """The longest tests (marked ``heavy``, with their seconds on the 2-core CI machine)
    start first, dealt in turn to the head of each worker's share: pytest-xdist's worksteal
    hands each worker a contiguous share of this list and steals from the tail, so a long
    test left near the end would run alone while the other workers sit idle."""
    def seconds(item: pytest.Item) -> float:
        mark = item.get_closest_marker("heavy")
        return float(mark.args[0]) if mark else 0.0

    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    heavy = sorted((i for i in items if seconds(i)), key=seconds, reverse=True)
    light = [i for i in items if not seconds(i)]
    share, ordered = len(items) // workers, []
    for k in range(workers):
        dealt = heavy[k::workers]
        take = max(0, share - len(dealt)) if k < workers - 1 else len(light)
        ordered += dealt + light[:take]
        light = light[take:]
    items[:] = ordered


# A file: when each test ran, on which worker, and the CPU seconds it took (its own and its
# subprocesses' that were waited for: what the suite's time on two cores is made of).
TIMELINE = os.environ.get("ROCM_AUTOPATCH_TEST_TIMELINE")


def _cpu_seconds() -> float:
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator:
    start, cpu = time.time(), _cpu_seconds() if TIMELINE else 0.0
    yield
    if TIMELINE:
        with open(TIMELINE, "a") as fh:
            fh.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {start:.1f} "
                     f"{time.time():.1f} {_cpu_seconds() - cpu:.1f} {item.nodeid}\n")


# A file: every process a test starts itself (the test, the program and its first
# arguments, a digest of its environment): the census behind the suite's time (TESTING.md).
LAUNCHES = os.environ.get("ROCM_AUTOPATCH_TEST_LAUNCHES")
if LAUNCHES:
    _popen_init = subprocess.Popen.__init__

    def _logged_init(self, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
        try:  # the census never changes a test's outcome
            env = kwargs.get("env")
            env = os.environ if env is None else env
            key = hashlib.sha1(repr(sorted((str(k), str(v)) for k, v in env.items()
                                           if not str(k).startswith("PYTEST_"))).encode())
            argv = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
            with open(LAUNCHES, "a") as fh:
                fh.write(json.dumps({
                    "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
                    "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
                    "argv": [Path(argv[0]).name, *[a[:80] for a in argv[1:4]]],
                    "env": key.hexdigest()[:10], "cwd": str(kwargs.get("cwd"))}) + "\n")
        except Exception:  # noqa: BLE001
            pass
        _popen_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = _logged_init  # type: ignore[method-assign]
