"""Bad input at every entry point, as a property: whatever wrong value a
user gives in any one place, the command says so in one line, exits 2,
and leaves no file and no process behind.

Every subcommand and ``python -m`` tool lists its places in SLOTS;
hypothesis picks the bad value; commands run in-process with a QEMU that
fails at once.  docs/setup-and-tests.md, "tests/cli/test_bad_input_property.py"."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fake_qemu
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memqual.host.cli import main as cli
from memqual.host.cli import testsummary
from memqual.lab import bench_boot, memslots_bench

# A value that went through should end the command long before this; one
# that would start real work (a boot, a measurement) is stopped here.
ALARM_S = 20


@dataclasses.dataclass(frozen=True)
class Fixtures:
    """The bad things, made once, and the valid companions of each place."""

    root: Path
    not_utf8: Path
    not_json: Path
    empty: Path
    json_list: Path
    json_object: Path
    directory: Path
    results: Path
    layout: Path
    junit: Path
    missing: Path
    bad_contents: tuple[Path, ...]
    deep_toml: Path

    def bad_files(self) -> list[str]:
        """Where a file to read is expected."""
        return [
            str(p) for p in (self.not_utf8, self.not_json, self.empty, self.json_list, self.json_object, self.directory)
        ] + ["/dev/null", str(self.missing)]

    def bad_results(self) -> list[str]:
        """Where a results.json is expected: the files of the wrong kind,
        and results files whose content no memqual run writes."""
        return [*self.bad_files(), *map(str, self.bad_contents)]

    def bad_dirs(self) -> list[str]:
        """Where a directory to read is expected."""
        return [str(self.not_json), str(self.not_utf8), "/dev/null", str(self.missing)]

    def bad_outputs(self) -> list[str]:
        """Where a file is to be written: a directory, or below a file."""
        return [str(self.directory), str(self.not_json / "out.json"), "/dev/null/out"]


# Numbers that are no number a command can use: not finite, negative,
# overflowing to infinity, or no number at all.
BAD_NUMBERS = ["nan", "NaN", "inf", "-inf", "-1", "1e309", "-1e309", "abc", ""]
BAD_COUNTS = [*BAD_NUMBERS, "0", "1.5", "99999999999999999999999999"]
TOO_WIDE = ["/usr", "/"]


@dataclasses.dataclass(frozen=True)
class Slot:
    """One place a command takes a value: ``argv(value)`` is the whole
    command line with ``value`` there; ``values`` the bad ones to try."""

    name: str
    argv: Callable[[str], list[str]]
    values: Callable[[Fixtures], list[str]]
    tool: str = "memqual"  # or the python -m module


def files(f: Fixtures) -> list[str]:
    return f.bad_files()


def results_files(f: Fixtures) -> list[str]:
    return f.bad_results()


def hosts_files(f: Fixtures) -> list[str]:
    return [*f.bad_files(), str(f.deep_toml)]


def dirs(f: Fixtures) -> list[str]:
    return f.bad_dirs()


def modules_dirs(f: Fixtures) -> list[str]:
    return [*f.bad_dirs(), *TOO_WIDE]


def outputs(f: Fixtures) -> list[str]:
    return f.bad_outputs()


def numbers(f: Fixtures) -> list[str]:
    return BAD_NUMBERS


def counts(f: Fixtures) -> list[str]:
    return BAD_COUNTS


def state_dirs(f: Fixtures) -> list[str]:
    return [str(f.not_json), "/dev/null", str(f.not_json / "below-a-file")]


def layouts(f: Fixtures) -> list[str]:
    return [*f.bad_files(), "no-such-layout", "../../etc/passwd"]


def devices(f: Fixtures) -> list[str]:
    return [*f.bad_files(), "/dev/zero"]


def reports(f: Fixtures) -> list[str]:
    """testsummary's inputs: a missing one is counted as a failed step (the
    step did not run), so only the ones of the wrong kind are bad."""
    return [p for p in f.bad_files() if p != str(f.missing)]


def kernel_names(f: Fixtures) -> list[str]:
    return ["../../../etc", "6.1.0-57-amd64/../..", "-rf", "a b", ""]


def fx() -> Fixtures:
    """Set by the module fixture: slot lambdas read companions through it."""
    return _FIXTURES[0]


_FIXTURES: list[Fixtures] = []


def R() -> str:
    return str(fx().results)


def L() -> str:
    return str(fx().layout)


def D() -> str:
    return str(fx().directory)


SLOTS: list[Slot] = [
    # memqual image
    Slot("image build --kernel", lambda v: ["image", "build", "--kernel", v, "--modules", D()], files),
    Slot("image build --modules", lambda v: ["image", "build", "--kernel", "/dev/null", "--modules", v], modules_dirs),
    Slot("image build --debian-kernel", lambda v: ["image", "build", "--debian-kernel", v], kernel_names),
    Slot("image kernels (cache)", lambda v: ["image", "kernels", "--json"], state_dirs),
    Slot("image clean (cache)", lambda v: ["image", "clean"], state_dirs),
    # memqual doctor takes no value: a stray one is refused (a cache it
    # cannot use is a row of its report, not an error)
    Slot("doctor", lambda v: ["doctor", "--json", v], files),
    # memqual boot
    Slot("boot --memory", lambda v: ["boot", "--memory", v, "--", "true"], counts),
    Slot("boot --cpus", lambda v: ["boot", "--cpus", v, "--", "true"], counts),
    Slot("boot --timeout", lambda v: ["boot", "--timeout", v, "--", "true"], numbers),
    Slot("boot --kernel", lambda v: ["boot", "--kernel", v, "--modules", D(), "--", "true"], files),
    Slot("boot --modules", lambda v: ["boot", "--kernel", "/dev/null", "--modules", v, "--", "true"], modules_dirs),
    Slot("boot --debian-kernel", lambda v: ["boot", "--debian-kernel", v, "--", "true"], kernel_names),
    Slot("boot --qemu", lambda v: ["boot", "--qemu", v, "--", "true"], files),
    # memqual qemu
    Slot("qemu list (cache)", lambda v: ["qemu", "list", "--json"], state_dirs),
    # memqual ksm
    Slot("ksm status --pid", lambda v: ["ksm", "status", "--pid", v], counts),
    Slot("ksm status --state-dir", lambda v: ["ksm", "status", "--state-dir", v], state_dirs),
    Slot("ksm status --sysfs", lambda v: ["ksm", "status", "--sysfs", v], dirs),
    Slot("ksm restore --wait", lambda v: ["ksm", "restore", "--wait", v], numbers),
    Slot("ksm restore --state-dir", lambda v: ["ksm", "restore", "--state-dir", v], state_dirs),
    Slot("ksm restore --sysfs", lambda v: ["ksm", "restore", "--sysfs", v], dirs),
    # memqual balloon
    Slot("balloon model --per-page-us", lambda v: ["balloon", "model", "--per-page-us", v], numbers),
    Slot("balloon model --fixed-ms", lambda v: ["balloon", "model", "--fixed-ms", v], numbers),
    Slot("balloon model --record", lambda v: ["balloon", "model", "--record", v], files),
    Slot("balloon curve SOURCE", lambda v: ["balloon", "curve", v], files),
    Slot("balloon curve --png", lambda v: ["balloon", "curve", R(), "--png", v], outputs),
    Slot("balloon measure --memory", lambda v: ["balloon", "measure", "--target", "256", "--memory", v], counts),
    Slot("balloon measure --target", lambda v: ["balloon", "measure", "--target", v], counts),
    Slot("balloon measure --repeats", lambda v: ["balloon", "measure", "--target", "256", "--repeats", v], counts),
    Slot(
        "balloon measure --pfns-per-request",
        lambda v: ["balloon", "measure", "--target", "256", "--pfns-per-request", v],
        counts,
    ),
    # memqual compare
    Slot("compare A", lambda v: ["compare", v, R()], results_files),
    Slot("compare B", lambda v: ["compare", R(), v], results_files),
    Slot("compare --threshold", lambda v: ["compare", R(), R(), "--threshold", v], numbers),
    Slot("compare --alpha", lambda v: ["compare", R(), R(), "--alpha", v], numbers),
    Slot("compare --html", lambda v: ["compare", R(), R(), "--html", v], outputs),
    # memqual run: --tests is an empty directory, so nothing could run
    Slot("run --output", lambda v: ["run", "--tests", D(), "--output", v], state_dirs),
    # A regular file that is no kernel is not looked into before the job: the
    # scenarios refuse it (exit 1); only what is no file at all is bad input.
    Slot(
        "run --guest-kernel",
        lambda v: ["run", "--tests", D(), "--guest-kernel", v, "--guest-modules", D()],
        lambda f: [str(f.directory), "/dev/null", str(f.missing)],
    ),
    Slot(
        "run --guest-modules",
        lambda v: ["run", "--tests", D(), "--guest-kernel", str(fx().junit), "--guest-modules", v],
        # A directory that is no modules tree (/usr) is refused by the image
        # build in each scenario, not before the job.
        dirs,
    ),
    Slot("run --debian-kernel", lambda v: ["run", "--tests", D(), "--debian-kernel", v], kernel_names),
    Slot("run --rounds", lambda v: ["run", "--tests", D(), "--rounds", v], counts),
    Slot("run --budget", lambda v: ["run", "--tests", D(), "--until-decided", "--budget", v], numbers),
    Slot("run --parallel", lambda v: ["run", "--tests", D(), "--parallel", v], counts),
    Slot("run --tests", lambda v: ["run", "--tests", v], lambda f: [str(f.missing), "/dev/null", str(f.not_utf8)]),
    # memqual memslots
    Slot("memslots model --layout", lambda v: ["memslots", "model", "--layout", v], layouts),
    Slot("memslots model --lookups", lambda v: ["memslots", "model", "--layout", L(), "--lookups", v], counts),
    Slot("memslots model --seed", lambda v: ["memslots", "model", "--layout", L(), "--seed", v], numbers),
    Slot("memslots lookup --layout", lambda v: ["memslots", "lookup", "--layout", v, "0x100"], layouts),
    Slot("memslots lookup GFN", lambda v: ["memslots", "lookup", "--layout", L(), v], numbers),
    Slot("memslots kvm --slots", lambda v: ["memslots", "kvm", "--slots", v], counts),
    Slot("memslots kvm --repeats", lambda v: ["memslots", "kvm", "--repeats", v], counts),
    Slot("memslots kvm --slot-pages", lambda v: ["memslots", "kvm", "--slot-pages", v], counts),
    Slot(
        "memslots kvm --device", lambda v: ["memslots", "kvm", "--device", v], lambda f: [*f.bad_files(), "/dev/zero"]
    ),
    Slot("memslots kvm --records", lambda v: ["memslots", "kvm", "--records", v], state_dirs),
    Slot("memslots kvm --replicates", lambda v: ["memslots", "kvm", "--lookup", "--replicates", v], counts),
    Slot("memslots kvm --rounds", lambda v: ["memslots", "kvm", "--lookup", "--rounds", v], counts),
    Slot("memslots kvm --iterations", lambda v: ["memslots", "kvm", "--lookup", "--iterations", v], counts),
    Slot("memslots qemu --layout", lambda v: ["memslots", "qemu", "--plan", "--layout", v], layouts),
    Slot("memslots qemu --ram", lambda v: ["memslots", "qemu", "--plan", "--ram", v], counts),
    Slot("memslots qemu --maxmem", lambda v: ["memslots", "qemu", "--plan", "--maxmem", v], counts),
    Slot("memslots qemu --slots", lambda v: ["memslots", "qemu", "--plan", "--slots", v], counts),
    Slot("memslots qemu --hotplug", lambda v: ["memslots", "qemu", "--plan", "--hotplug", v], numbers),
    Slot("memslots qemu --trace-out", lambda v: ["memslots", "qemu", "--probe", "--trace-out", v], outputs),
    # memqual bisect
    Slot("bisect --kernels", lambda v: ["bisect", "--kernels", v, v, "--metric", "deflate_s"], kernel_names),
    Slot("bisect --host-kernels", lambda v: ["bisect", "--host-kernels", v, v, "--metric", "deflate_s"], kernel_names),
    Slot(
        "bisect --host-kernel-param",
        lambda v: [
            "bisect",
            "--host-kernels",
            "6.1.0-57-amd64",
            "6.1.0-57-amd64:quiet",
            "--host-kernel-param",
            v,
            "--metric",
            "m",
        ],
        lambda f: ["kvm_amd", "kvm_amd.npt", "kvm_amd.npt=0;x", "../x=1", ""],
    ),
    Slot("bisect --threshold", lambda v: ["bisect", "--kernels", "a", "b", "--metric", "m", "--threshold", v], numbers),
    Slot("bisect --budget", lambda v: ["bisect", "--kernels", "a", "b", "--metric", "m", "--budget", v], numbers),
    Slot(
        "bisect --max-rounds", lambda v: ["bisect", "--kernels", "a", "b", "--metric", "m", "--max-rounds", v], counts
    ),
    Slot("bisect --resume", lambda v: ["bisect", "--resume", v], lambda f: [*f.bad_files(), *TOO_WIDE]),
    Slot("bisect --output", lambda v: ["bisect", "--kernels", "a", "b", "--metric", "m", "--output", v], state_dirs),
    # memqual export
    Slot("export RESULTS", lambda v: ["export", "--kcidb", "-", v], results_files),
    Slot("export --kcidb", lambda v: ["export", "--kcidb", v, R()], outputs),
    # memqual history
    Slot("history PATH", lambda v: ["history", v], results_files),
    # beside a good run (a directory is searched for results files, so only bad content here)
    Slot("history PATH (second run)", lambda v: ["history", R(), v], lambda f: list(map(str, f.bad_contents))),
    Slot("history --threshold", lambda v: ["history", R(), "--threshold", v], numbers),
    Slot("history --html", lambda v: ["history", R(), "--html", v], outputs),
    # memqual hosts
    Slot("hosts check FILE", lambda v: ["hosts", "check", v], hosts_files),
    Slot("hosts probe", lambda v: ["hosts", "probe", v], files),
    Slot("run --hosts", lambda v: ["run", "--tests", D(), "--hosts", v], files),
    # memqual kernel, and the options it adds to run
    Slot("kernel build SOURCE", lambda v: ["kernel", "build", v], lambda f: [*f.bad_dirs(), *kernel_names(f)]),
    Slot("kernel build --patch", lambda v: ["kernel", "build", D(), "--patch", v], files),
    Slot("kernel build --config", lambda v: ["kernel", "build", D(), "--config", v], files),
    Slot("kernel build --jobs", lambda v: ["kernel", "build", D(), "--jobs", v], counts),
    Slot("kernel import BZIMAGE", lambda v: ["kernel", "import", v], files),
    Slot("qemu build --patch", lambda v: ["qemu", "build", "--patch", v], files),
    Slot("qemu build --version", lambda v: ["qemu", "build", "--version", v], kernel_names),
    Slot("qemu build --jobs", lambda v: ["qemu", "build", "--jobs", v], counts),
    Slot("kernel list (cache)", lambda v: ["kernel", "list"], state_dirs),
    Slot("run --patch", lambda v: ["run", "--tests", D(), "--patch", v], files),
    Slot("run --kernel-source", lambda v: ["run", "--tests", D(), "--kernel-source", v, "--kernel-source", v], dirs),
    Slot(
        "run --kernel-config",
        lambda v: ["run", "--tests", D(), "--kernel-source", D(), "--kernel-source", D(), "--kernel-config", v],
        files,
    ),
    # memqual run --host-patch (host/cli/host_patch.py)
    Slot("run --host-patch", lambda v: ["run", "--tests", D(), "--host-patch", v], files),
    # memqual run --qemu-patch (host/cli/qemu_patch.py)
    Slot("run --qemu-patch", lambda v: ["run", "--tests", D(), "--qemu-patch", v], files),
    Slot("run --qemu-base-patch", lambda v: ["run", "--tests", D(), "--qemu-patch", v, "--qemu-base-patch", v], files),
    Slot(
        "run --host-kernel-source",
        lambda v: ["run", "--tests", D(), "--host-kernel-source", v, "--host-kernel-source", v],
        dirs,
    ),
    Slot(
        "run --host-kernel-config",
        lambda v: ["run", "--tests", D(), *["--host-kernel-source", D()] * 2, "--host-kernel-config", v],
        files,
    ),
    # python -m tools (the lab's too: a user runs them, from a checkout)
    Slot("bench_boot --boots", lambda v: ["--boots", v], counts, "memqual.lab.bench_boot"),
    Slot("bench_boot --memory", lambda v: ["--memory", v], counts, "memqual.lab.bench_boot"),
    Slot("bench_boot --cpus", lambda v: ["--cpus", v], counts, "memqual.lab.bench_boot"),
    Slot("bench_boot --timeout", lambda v: ["--timeout", v], numbers, "memqual.lab.bench_boot"),
    Slot("memslots_bench --layout", lambda v: ["--layout", v], layouts, "memqual.lab.memslots_bench"),
    Slot("memslots_bench --repeats", lambda v: ["--repeats", v], counts, "memqual.lab.memslots_bench"),
    Slot("memslots_bench --batch", lambda v: ["--batch", v], counts, "memqual.lab.memslots_bench"),
    Slot("testsummary JUNIT", lambda v: [v, D()], reports, "memqual.host.cli.testsummary"),
    Slot(
        "testsummary AVOCADO",
        lambda v: [str(fx().junit), v],
        lambda f: [str(f.not_json), str(f.not_utf8), "/dev/null"],
        "memqual.host.cli.testsummary",
    ),
    Slot("testsummary STATUSES", lambda v: [str(fx().junit), D(), v], reports, "memqual.host.cli.testsummary"),
]

# Where a slot's value goes into the environment instead of argv.
ENV_SLOTS = {
    "image kernels (cache)": "MEMQUAL_CACHE",
    "image clean (cache)": "MEMQUAL_CACHE",
    "qemu list (cache)": "MEMQUAL_CACHE",
    "kernel list (cache)": "MEMQUAL_CACHE",
}

TOOLS: dict[str, Callable[[list[str]], int]] = {
    "memqual": cli.main,
    "memqual.lab.bench_boot": bench_boot.main,
    "memqual.lab.memslots_bench": memslots_bench.main,
    "memqual.host.cli.testsummary": testsummary.main,
}


class WentAhead(BaseException):
    """Raised by the alarm: the command did not stop at the bad value.  Not
    an Exception, so that memqual's last line of defence does not turn it
    into an exit status."""


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def ring(signum: int, frame: object) -> None:
        raise WentAhead(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(values)
    os.environ.pop("MEMQUAL_DEBUG", None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def tree(root: Path) -> set[str]:
    return {str(Path(d) / n) for d, dirnames, filenames in os.walk(root) for n in [*dirnames, *filenames]}


def children() -> set[int]:
    """This process's children, from every process's /proc stat (read as
    bytes with one read: a third of the time of Path.read_text, twice an
    example)."""
    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fd = os.open(f"/proc/{entry}/stat", os.O_RDONLY)
                try:
                    stat = os.read(fd, 4096)
                finally:
                    os.close(fd)
                if int(stat.rsplit(b")", 1)[1].split()[1]) == me:
                    found.add(int(entry))
    return found


def _bad_results_files(root: Path, good: Path) -> tuple[Path, ...]:
    """results.json files no memqual run writes: JSON no reader should walk
    (deep nesting, an integer of 5000 digits, NaN, Infinity), content of
    the wrong types (booleans as samples, a list as key, strings as
    settings or run), samples whose sums overflow (1e308), and a file cut
    off midway."""
    import json

    text = good.read_text()
    data = json.loads(text)
    samples = data["metrics"][0]["samples"]

    def changed(name: str, change: Callable[[dict[str, Any]], object]) -> tuple[str, str]:
        copy = json.loads(text)
        change(copy)
        return name, json.dumps(copy)

    def all_samples(value: object) -> Callable[[dict[str, Any]], object]:
        def change(d: dict[str, Any]) -> None:
            m = d["metrics"][0]
            m["samples"] = [value] * len(samples)
            m["replicates"] = [[value] * len(r) for r in m["replicates"]]

        return change

    contents = dict(
        [
            ("deep", '{"schema": "memqual.results/1", "run": ' + "[" * 100000 + "]" * 100000 + "}"),
            ("huge-int", text.replace('"metrics": [', '"huge": ' + "9" * 5000 + ', "metrics": [', 1)),
            ("nan", text.replace(repr(samples[0]), "NaN", 1)),
            ("infinity", text.replace(repr(samples[0]), "Infinity", 1)),
            ("overflow", text.replace(repr(samples[0]), "1e999", 1)),
            changed("boolean-samples", all_samples(True)),
            changed("huge-samples", all_samples(1e308)),
            changed("list-key", lambda d: d["metrics"][0].update(key=["k"])),
            changed("string-settings", lambda d: d["metrics"][0].update(settings="pages=4k")),
            changed("string-run", lambda d: d.update(run="quick")),
            ("truncated", text[: len(text) // 2]),
        ]
    )
    paths = []
    for name, content in contents.items():
        path = root / f"results-{name}.json"
        path.write_text(content)
        paths.append(path)
    return tuple(paths)


def make_fixtures(root: Path) -> Fixtures:
    from results_files import inflate_record, write_results_file

    (root / "dir").mkdir()
    results = write_results_file(root / "results.json", [inflate_record([[0.8, 0.81], [0.79, 0.8], [0.82, 0.8]])])
    layout = root / "layout.json"
    layout.write_text((Path(__file__).parents[2] / "host" / "memslots" / "layouts" / "seed-3.json").read_text())
    junit = root / "junit.xml"
    junit.write_text('<testsuite tests="1" failures="0" errors="0" skipped="0"><testcase name="t"/></testsuite>\n')
    bad_contents = _bad_results_files(root, results)
    deep_toml = root / "deep.toml"
    deep_toml.write_text("[[host]]\nname = 'x'\naddress = " + "[" * 5000 + "]" * 5000 + "\n")
    made = Fixtures(
        root=root,
        not_utf8=root / "not-utf8.json",
        not_json=root / "not-json.json",
        empty=root / "empty.json",
        json_list=root / "list.json",
        json_object=root / "object.json",
        directory=root / "dir",
        results=results,
        layout=layout,
        junit=junit,
        missing=root / "no-such-file",
        bad_contents=bad_contents,
        deep_toml=deep_toml,
    )
    made.not_utf8.write_bytes(b"\xff\xfe{\x80 not text \xc3\x28\n")
    made.not_json.write_text("this is not JSON\n")
    made.empty.write_text("")
    made.json_list.write_text("[1, 2, 3]\n")
    made.json_object.write_text('{"schema": "something/else"}\n')
    for private in ("cache", "state", "cwd"):
        (root / private).mkdir(mode=0o700)
    fake_qemu.install(root / "qemu", "exit")
    _FIXTURES[:] = [made]
    return made


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixtures]:
    yield make_fixtures(tmp_path_factory.mktemp("bad-input"))
    _FIXTURES.clear()


@pytest.fixture(scope="module")
def one_parser() -> Iterator[None]:
    """memqual's parser built once for every example: memqual builds it at
    each start, which took most of an example's time (its some 190 options,
    each with argparse's gettext lookups), and argparse keeps nothing of one
    parse for the next."""
    parser = cli.build_parser()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "build_parser", lambda: parser)
        yield


def bad_values(slot: Slot, made: Fixtures) -> st.SearchStrategy[str]:
    listed = st.sampled_from(slot.values(made))
    if slot.values in (numbers, counts):
        # Beyond the list: any number that is not finite, or negative.
        unusable = st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not math.isfinite(x) or x < 0)
        return st.one_of(listed, unusable.map(repr), st.integers(max_value=-1).map(str))
    return listed


def run(slot: Slot, value: str, made: Fixtures, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    env = {
        "MEMQUAL_CACHE": str(made.root / "cache"),
        "MEMQUAL_STATE_DIR": str(made.root / "state"),
        "MEMQUAL_QEMU": str(made.root / "qemu" / "qemu-fake-exit"),
    }
    if slot.name in ENV_SLOTS:
        env[ENV_SLOTS[slot.name]] = value
    argv = slot.argv(value)
    cwd = os.getcwd()
    os.chdir(made.root / "cwd")
    try:
        with environment(env), alarm(ALARM_S):
            try:
                status = TOOLS[slot.tool](argv)
            except SystemExit as exc:  # argparse
                status = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(cwd)
    return status, capsys.readouterr().err


@pytest.mark.parametrize("slot", SLOTS, ids=[s.name for s in SLOTS])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_bad_value_anywhere_is_one_line_exit_2_and_nothing_left(
    slot: Slot, data: st.DataObject, made: Fixtures, capsys: pytest.CaptureFixture[str], one_parser: None
) -> None:
    value = data.draw(bad_values(slot, made), label="value")
    before, running = tree(made.root), children()
    status, err = run(slot, value, made, capsys)
    lines = err.splitlines()
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"{slot.argv(value)}: {err!r}"
    assert status == 2, f"{slot.argv(value)}: exit {status}: {err!r}"
    assert tree(made.root) == before, f"{slot.argv(value)} left {tree(made.root) - before}"
    assert children() <= running, f"{slot.argv(value)} left processes running"


def test_every_subcommand_has_its_places(made: Fixtures) -> None:
    """A subcommand added without a slot here fails: list where it takes
    input (or its environment, for one that takes none)."""
    parser = cli.build_parser()
    commands: set[str] = set()

    def walk(p: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            commands.add(" ".join(prefix))
            return
        for name, child in subs[0].choices.items():
            walk(child, (*prefix, name))

    walk(parser, ())
    covered = {" ".join(s.argv("X")[: len(c.split())]) for s in SLOTS if s.tool == "memqual" for c in commands}
    assert commands - covered == set()


# -- valid-looking input with hostile content: markup, extreme figures, a lab host's answers --
# A metric name is any non-empty string: some are markup somewhere memqual
# shows them (matplotlib's mathtext, Jinja, rich's markup, the terminal's
# escapes, HTML).  They must stay text: drawn, escaped, shown.
MARKUP_NAMES = [
    r"$\frac{1}{$",
    "$x^2$",
    "{{ 7*7 }}",
    "{% if true %}x{% endif %}",
    "<script>x</script>",
    "[bold red]x[/]",
    "\x1b]0;retitled\x07",
    "\x1b[2J\x1b[1A",
    "\u202eevil",
    "a\x00b\x7f",
    "%s%n%(x)s",
]
# The schema's samples: 0, or a magnitude from 1e-100 to 1e100.
EXTREMES = [1e100, -1e100, 1e-100, -1e-100, 0.0, 1.0]
metric_names = st.one_of(
    st.sampled_from(MARKUP_NAMES),
    st.lists(st.sampled_from(MARKUP_NAMES) | st.text(min_size=1, max_size=8), min_size=1, max_size=3).map("".join),
)
finite = st.one_of(
    st.sampled_from(EXTREMES),
    st.floats(min_value=-1e100, max_value=1e100, allow_nan=False).filter(lambda x: x == 0 or abs(x) >= 1e-100),
)
replicate_sets = st.lists(st.lists(finite, min_size=1, max_size=3), min_size=1, max_size=4)


def _results_with(path: Path, metric: str, replicates: list[list[float]]) -> Path:
    from results_files import write_results_file

    from memqual.host.core.record import Measurement

    record = Measurement(
        scenario="balloon.inflate", metric=metric, unit="s", better="lower", samples=[], replicates=replicates
    )
    return write_results_file(path, [record])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=metric_names, a=replicate_sets, b=replicate_sets)
def test_compare_of_valid_files_exits_1_only_for_slower_and_shows_names_as_text(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], name: str, a: list, b: list
) -> None:
    root = tmp_path_factory.mktemp("hostile")
    path_a, path_b = _results_with(root / "a.json", name, a), _results_with(root / "b.json", name, b)
    page = root / "compare.html"
    with environment({}), alarm(ALARM_S):
        status = cli.main(["compare", str(path_a), str(path_b), "--all-metrics", "--html", str(page)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "unexpected" not in err, err
    assert "\x1b" not in out + err, repr(out + err)
    if status == 2:
        assert len(err.splitlines()) == 1, err
        return
    assert status in (0, 1), (status, err)
    assert (status == 1) == ("slower (shown to differ" in out), out
    html = page.read_text()
    assert "<script>x" not in html
    if "{{ 7*7 }}" in name:
        assert "{{ 7*7 }}" in html  # shown, never evaluated


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=metric_names, replicates=replicate_sets)
# Samples at the schema's limits: their spread (1.41e100) is written beside
# them and must read back.
@example(name="x", replicates=[[1e100, -1e100]])
def test_a_report_of_hostile_names_and_extreme_figures_is_written(
    tmp_path_factory: pytest.TempPathFactory, name: str, replicates: list
) -> None:
    from memqual.host.judge.results import load_results
    from memqual.host.report import report

    root = tmp_path_factory.mktemp("report")
    results = load_results(_results_with(root / "r.json", name, replicates))
    page = report.write_html(results, root / "report.html").read_text()
    assert "<script>x" not in page


json_values = st.recursive(
    st.none() | st.booleans() | finite | st.integers() | st.text(max_size=12) | st.sampled_from(MARKUP_NAMES),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def _probe_answers() -> st.SearchStrategy[str]:
    """What a lab host may answer to ``memqual hosts probe``: a right one
    with hostile values, wrong types, nesting too deep, or no JSON."""
    from memqual.host.run.hosts.probe import SCHEMA, memqual_version

    fields = st.fixed_dictionaries(
        {
            "schema": st.sampled_from([SCHEMA, "other/1"]),
            "version": st.sampled_from([memqual_version(), "0.0.0"]) | st.sampled_from(MARKUP_NAMES),
            "boot_id": st.text(max_size=8) | st.sampled_from(MARKUP_NAMES),
            "environment": st.dictionaries(st.text(max_size=8), json_values, max_size=4) | json_values,
            "lock_free": json_values,
            "lock_holder": json_values,
        },
        optional={"cleaned_qemu": json_values, "qemu_binary": json_values, "qemu_problem": json_values},
    ).map(json.dumps)
    deep = st.integers(min_value=65, max_value=200_000).map(
        lambda n: f'{{"schema": "{SCHEMA}", "environment": ' + "[" * n + "]" * n + "}"
    )
    return st.one_of(fields, deep, st.text(max_size=40), json_values.map(json.dumps))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_lab_hosts_probe_answer_is_its_own_problem_at_most(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Whatever one host answers, the check of every host ends: that host
    usable or not (with its reason), the other one usable, and nothing of
    the answer sent to the terminal as a control character."""
    from memqual.host.run.hosts import check, config

    root = tmp_path_factory.mktemp("probe")
    (root / "k").write_text("x")
    hosts = [config.LabHost(name=n, address="10.0.0.1", key=root / "k", known_hosts=root / "k") for n in ("x", "y")]
    answer = data.draw(_probe_answers(), label="answer")
    good = json.dumps(
        {
            "schema": "memqual.hostprobe/1",
            "version": __import__("memqual.host.run.hosts.probe", fromlist=["x"]).memqual_version(),
            "boot_id": "b",
            "environment": {},
            "lock_free": True,
        }
    )

    import subprocess

    original = check.ssh.run
    check.ssh.run = lambda host, argv, timeout_s: subprocess.CompletedProcess(
        list(argv), 0, answer if host.name == "x" else good, ""
    )
    try:
        results = check.for_each(hosts, check.probe_host)
    finally:
        check.ssh.run = original
    assert results[1].usable, results[1].problem
    assert results[0].usable or results[0].problem
    for line in check.lines(results):
        assert "\x1b" not in line and "\x00" not in line, repr(line)
    json.dumps([r.to_json() for r in results])  # fleet.json takes it
