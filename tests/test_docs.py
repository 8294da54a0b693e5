"""The README's examples, the demo command and the examples keep working, and every
sample output the pages show is what the same run prints.

Sample outputs: a fenced block that shows output is preceded in the Markdown by
``<!-- sample: NAME -->``, NAME a key of ``BLOCK_SAMPLES`` (what the ``python`` block
above it prints, checked by the test that runs that block) or of ``CLI_SAMPLES`` (what
the named command prints in the command-line session of ``test_cli_samples``); any other
fenced block that is not code says ``<!-- not output: WHY -->``. In a ``python`` block a
comment ``# prints: TEXT`` is a line the block prints (``…`` stands for the rest of the
line). Parts that vary from run to run or machine to machine (times, paths, memory
sizes, thread counts) are made the same on both sides by each sample's patterns."""

from __future__ import annotations

import dataclasses
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from src_dask.trains import exact_product

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!-- (?P<marker>[^\n]*?) -->\n)?^```(?P<lang>[^\n]*)\n(?P<body>.*?)^```$",
                   flags=re.S | re.M)
OUTPUT_LANGS = ("", "text", "console")  # fenced blocks that could show output


@dataclasses.dataclass(frozen=True)
class Sample:
    """How a shown sample is compared with what its run printed: ``mode`` ``whole`` (all
    the output, or all that went to one stream), ``line`` (one line of the output) or
    ``start`` (a line that begins as the sample up to its ``…``); ``vary`` maps a pattern
    to what it stands for, on both sides."""

    mode: str = "whole"
    vary: tuple = ()

    def normal(self, text: str) -> str:
        for pattern, stands_for in self.vary:
            text = re.sub(pattern, stands_for, text)
        return "\n".join(line.rstrip() for line in text.strip().splitlines())

    def check(self, shown: str, printed: str | list) -> None:
        outputs = [printed] if isinstance(printed, str) else printed
        want = self.normal(shown)
        if self.mode == "whole":
            got = [self.normal(o) for o in outputs]
            assert want in got, f"shown:\n{want}\nprinted:\n" + "\n--\n".join(got)
            return
        lines = [self.normal(line) for o in outputs for line in o.splitlines()]
        if self.mode == "line":
            assert want in lines, f"shown:\n{want}\nprinted:\n" + "\n".join(lines)
        else:
            head = want.split("…")[0]
            assert any(line.startswith(head) for line in lines), \
                f"shown:\n{want}\nprinted:\n" + "\n".join(lines)


TIME = (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", "<time>")
SECONDS = (r"\b\d+(\.\d+)? s\b", "<t> s")
BYTES = (r"\b\d+(\.\d+)? [kMGT]?i?B\b", "<bytes>")
# the sketch's blocks and the tasks follow the worker threads of the machine
BLOCKS = (r"\d+ blocks? of \d+", "<n> blocks of <n>")
THREADS = (r"\d+ workers? x \d+ threads?", "<n> workers x <n> threads")
TASKS = (r"\d+ tasks\b", "<n> tasks")

# what a python block prints (the sample follows the block on its page)
BLOCK_SAMPLES = {
    # a line the bar writes while pass 2 goes: its site, counts, bar and time vary
    "progress bar, pass 2": Sample("line", (
        (r"site \d+ -> 0", "site <j> -> 0"), SECONDS,
        (r"\d+/\d+ tasks (\[[#.]+\] +)?\d+%", "<k>/<n> tasks [<bar>] <p>%"))),
    "the src_dask logger at INFO": Sample("whole", (
        TIME, (r"worker memory [\d.]+ GB", "worker memory <m> GB"), BYTES, SECONDS, BLOCKS,
        THREADS, TASKS)),
}

# lines quoted in the running text of a page, printed by its python block of that id
BLOCK_QUOTES = {
    "docs/monitoring.md:1": [("`done: 2 passes over 40 sites`", Sample("line", (
        (r"(?m)^src_dask ", ""), (r"(?m) \|.*$", ""))))],
}

# what a command of the command-line session prints (test_cli_samples)
CLI_SAMPLES = {
    "src-dask info y.zarr": Sample("whole", ((r"inputs=\[[^\]]*\]", "inputs=[…]"),)),
    "src-dask info run.zarr": Sample("whole"),
    "src-dask run --help": Sample("whole"),  # its options, compared as a set
    "src-dask errors": Sample("whole", ((r"(/\S+|/home/me)/y\.zarr", "/…/y.zarr"),)),
}


def _fences(path: Path) -> list:
    """``(marker, lang, body)`` of every fenced block of ``path``."""
    return [(m["marker"], m["lang"].strip(), m["body"]) for m in FENCE.finditer(path.read_text())]


def _sample(name: str) -> str:
    """The text of the fenced block marked ``<!-- sample: name -->``."""
    (body,) = [b for path in PAGES for marker, _, b in _fences(path)
               if marker == f"sample: {name}"]
    return body


def _quoted(path: Path, text: str) -> str:
    """``text``, checked to be quoted on the page (white space as in running text)."""
    assert " ".join(text.split()) in " ".join(path.read_text().split()), (path.name, text)
    return text


def _python_blocks() -> list:
    """Every ``python`` code block of the README and the documentation pages, with the
    names of the samples of its output that follow it on its page."""
    out = []
    for path in PAGES:
        fences = _fences(path)
        blocks = [(i, body) for i, (_, lang, body) in enumerate(fences) if lang == "python"]
        for n, (i, body) in enumerate(blocks):
            end = blocks[n + 1][0] if n + 1 < len(blocks) else len(fences)
            names = [m.removeprefix("sample: ") for m, _, _ in fences[i + 1:end]
                     if m and m.startswith("sample: ")
                     and m.removeprefix("sample: ") in BLOCK_SAMPLES]
            name = f"{path.relative_to(ROOT)}:{n + 1}"
            quotes = [(path, q, how) for q, how in BLOCK_QUOTES.get(name, [])]
            out.append(pytest.param(body, names, quotes, id=name))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("block", "samples", "quotes"), _python_blocks())
def test_every_python_block_of_the_docs_runs_on_its_own(block, samples, quotes, tmp_path):
    """Each example is a complete program (imports, data, the main guard where it starts
    a cluster): run as a script of its own in an empty directory, it succeeds, and prints
    what its page shows it printing (its ``# prints:`` lines, the samples after it). A
    block whose first line is ``# needs: gpu`` runs where a GPU is."""
    from src_dask._cluster import has_gpu

    if block.startswith("# needs: gpu") and not has_gpu():
        pytest.skip("needs a GPU")
    script = tmp_path / "example.py"
    script.write_text(block)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    for shown in re.findall(r"# prints: (.*)$", block, flags=re.M):  # in order
        head = shown.split("…")[0].rstrip()
        at = next((i for i, line in enumerate(lines)
                   if (line.startswith(head) if "…" in shown else line == shown)), None)
        assert at is not None, (shown, done.stdout)
        lines = lines[at + 1:]
    for name in samples:
        BLOCK_SAMPLES[name].check(_sample(name), [done.stderr, done.stdout])
    for page, quote, how in quotes:
        how.check(_quoted(page, quote).strip("`"), [done.stderr, done.stdout])


def test_every_sample_output_is_checked():
    """Every fenced block that is not code is a sample a test compares with a run, or says
    why it shows no output; every sample the tests check is on a page, once."""
    names = []
    for path in PAGES:
        for marker, lang, body in _fences(path):
            if lang not in OUTPUT_LANGS:
                continue
            where = f"{path.relative_to(ROOT)}: {body.splitlines()[0] if body else ''}"
            assert marker and marker.startswith(("sample: ", "not output: ")), where
            if marker.startswith("sample: "):
                names.append(marker.removeprefix("sample: "))
    assert sorted(names) == sorted({*BLOCK_SAMPLES, *CLI_SAMPLES}), names


def test_the_docs_have_their_examples():
    """The pages keep their examples (a page rewritten without them would pass the test
    above by having none)."""
    assert len(_python_blocks()) >= 15


def test_demo_command(capsys, monkeypatch):
    """The demo's errors are those of the same SRC calls made here (plain, then
    oversampled: smaller), and --wait holds the cluster until Enter."""
    import src_dask
    from src_dask import problems
    from src_dask._cli import main

    waited = []
    monkeypatch.setattr("builtins.input", lambda prompt="": waited.append(prompt) or "")
    assert main(["demo", "--sites", "8", "--bond", "8", "--mpo-bond", "3", "--chi-out", "6",
                 "--workers", "1", "--seed", "2", "--wait"]) == 0
    out = capsys.readouterr().out
    assert "dashboard: http" in out and "MPO (bond 3)" in out and waited
    errors = [float(e) for e in re.findall(r"relative error ([0-9.e+-]+)", out)]
    mpo = problems.random_mpo(8, 3, seed=2, decay=0.5)
    mps = problems.random_mps(8, 8, seed=3, decay=0.9)
    exact = exact_product(mpo, mps)
    want = []
    for oversample in (0, "auto"):
        y = src_dask.apply(mpo, mps, 6, oversample=oversample, seed=2)
        want.append(float(np.linalg.norm((y.to_dense() - exact.to_dense()).ravel())
                          / np.linalg.norm(exact.to_dense().ravel())))
    assert errors == pytest.approx(want, rel=1e-3) and errors[1] < errors[0], (errors, want)


def test_module_entry_point_help():
    res = subprocess.run([sys.executable, "-m", "src_dask", "--help"], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0 and "demo" in res.stdout


@pytest.mark.parametrize("script", ["quickstart.py"])
def test_examples_run(script, capsys, monkeypatch):
    pytest.importorskip("quimb")
    monkeypatch.setattr(sys, "argv", [script])
    runpy.run_path(str(ROOT / "examples" / script), run_name="__main__")
    out = capsys.readouterr().out
    error = float(re.search(r"relative error against the exact product: (\S+)", out)[1])
    infidelity = float(re.search(r"1 - fidelity .*: (\S+)", out)[1])
    assert error < 1e-6 and abs(infidelity) < 1e-12  # chi_out is the product's exact bond


@pytest.mark.parametrize("script", ["quickstart.py", "ising_evolution.py", "out_of_core.py"])
def test_example_help_runs_nothing(script):
    res = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--help"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and res.stdout.startswith("usage:"), res.stderr
    assert "relative error" not in res.stdout


def _bash_block(page: str, containing: str) -> list[list[str]]:
    """The ``src-dask`` commands of the ``bash`` block of ``page`` that holds
    ``containing``, as argument lists (comments dropped)."""
    (body,) = [b for _, lang, b in _fences(ROOT / "docs" / page)
               if lang == "bash" and containing in b]
    return [shlex.split(line, comments=True) for line in body.splitlines()
            if line.startswith("src-dask ")]


class _CtrlC:
    """A Ctrl-C once a task of ``prefix`` has run (Dask's local scheduler runs the
    callback in the calling thread, as Python delivers SIGINT)."""

    def __init__(self, prefix: str):
        from dask.callbacks import Callback

        def stop(key, result, dsk, state, id):
            name = key[0] if isinstance(key, tuple) else key
            if str(name).startswith(prefix):
                raise KeyboardInterrupt

        self.callback = Callback(posttask=stop)

    def __enter__(self):
        return self.callback.__enter__()

    def __exit__(self, *exc):
        return self.callback.__exit__(*exc)


@pytest.mark.timeout(300)
def test_cli_samples(tmp_path, monkeypatch, capsys):
    """The commands of docs/cli.md, run as the page gives them at its sizes, print what
    the page shows: the result line, `info` of the result and of a run store, the distance
    line, the lines of an interrupted, resumed and finished run, the errors; and `run`'s
    synopsis names the options `run --help` lists."""
    from src_dask._cli import main

    cli = ROOT / "docs" / "cli.md"
    monkeypatch.chdir(tmp_path)

    def say(argv, interrupt=None):
        if interrupt is None:
            status = main(argv)
        else:
            with _CtrlC(interrupt):
                status = main(argv)
        got = capsys.readouterr()
        return status, got.out, got.err

    printed = {}
    for argv in _bash_block("cli.md", "src-dask generate mpo A.zarr"):
        if argv[1] == "demo":  # test_demo_command runs it, at smaller sizes
            continue
        status, out, err = say(argv[1:])
        assert status == 0, (argv, out, err)
        printed[" ".join(argv[:2])] = out
        if argv[1] == "run":
            printed["run argv"] = argv[1:]
    CLI_SAMPLES["src-dask info y.zarr"].check(_sample("src-dask info y.zarr"),
                                              printed["src-dask info"])
    Sample("start").check(_quoted(cli, "wrote mps (MPO·MPS, ket) to y.zarr: 20 sites, max "
                                       "bond 16, …"), printed["src-dask run"])
    shown = _quoted(cli, "RESULT against MPO·MPS: relative error …")
    Sample("start").check(shown.replace("RESULT", "y.zarr"), printed["src-dask distance"])

    # `run --check`: the same error at the end of its line
    status, out, _ = say([*printed["run argv"], "--check", "--overwrite"])
    assert _quoted(cli, "`run --check` appends the same error to its line")
    assert out.rstrip().endswith("; relative error " + printed["src-dask distance"].split()[-1])

    # the run with a store, interrupted in pass 2, resumed, then found finished
    (run, info) = _bash_block("cli.md", "--store run.zarr")
    status, out, err = say(run[1:], interrupt="pass2_site17")
    assert status == 130 and out == "", err
    site = re.search(r"at site (\d+)", err)[1]
    status, out, _ = say(info[1:])
    assert re.search(r"^  status +not complete", out, flags=re.M), out
    assert _quoted(cli, "`status` says `not complete`")
    interrupted = _quoted(cli, "src-dask: interrupted in pass 2, at site 17; run.zarr keeps "
                               "it: rerun the same command to resume")
    assert err.strip() == interrupted.replace("17", site)
    status, out, err = say(run[1:])
    assert status == 0, err
    resumed = _quoted(cli, "resumed the run in run.zarr from pass 2, at site 17")
    assert out.splitlines()[0] == resumed.replace("17", site)
    assert out.splitlines()[1].startswith("wrote mps (MPO·MPS, ket) to y2.zarr: 20 sites")
    status, out, _ = say(info[1:])
    CLI_SAMPLES["src-dask info run.zarr"].check(_sample("src-dask info run.zarr"), out)
    status, out, _ = say(run[1:] + ["--overwrite"])
    assert out.splitlines()[0] == _quoted(cli, "run.zarr held this run, finished: its "
                                               "result, not recomputed")
    # a store of another run
    status, out, err = say([*run[1:4], "--chi-out", "8", "--seed", "0", "--store", "run.zarr",
                            "--out", "y4.zarr"])
    assert status == 1 and _like(_quoted(ROOT / "docs" / "troubleshooting.md",
                                         "`… holds a run of other inputs or options`")
                                 .strip("`"), err), err
    # without a store, the one line
    status, out, err = say(["run", "A.zarr", "x.zarr", "--chi-out", "16", "--out", "y3.zarr"],
                           interrupt="pass1_site3")
    assert status == 130 and err == _quoted(cli, "`src-dask: interrupted`").strip("`") + "\n"

    # the errors, as the page shows them
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    lines = [say(["info", "x.zarr"])[2]]
    monkeypatch.chdir(tmp_path)
    lines.append(say(["run", "A.zarr", "x.zarr", "--chi-out", "16", "--out", "y.zarr"])[2])
    with pytest.raises(SystemExit):
        say(["run", "A.zarr", "x.zarr", "--chi-out", "0", "--out", "y.zarr"])
    lines.append(capsys.readouterr().err)
    CLI_SAMPLES["src-dask errors"].check(_sample("src-dask errors"), "".join(lines))

    # the synopsis of `run`: the options of its --help (and their arguments)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]

    def options(text):
        return set(re.findall(r"(?<![\w-])--?[a-z][a-z-]*", text)) - {"-h", "--debug"}

    assert options(_sample("src-dask run --help")) == options(usage)


def _like(shown: str, text: str) -> bool:
    """Whether ``text`` holds ``shown``, each ``…`` of it standing for anything."""
    pattern = ".*?".join(re.escape(part) for part in shown.split("…"))
    return re.search(pattern, " ".join(text.split())) is not None


def test_quoted_messages(tmp_path, caplog):
    """The errors, warnings and lines the pages quote are what the library says in the
    same situation (a GPU's own messages aside: below)."""
    import io
    import logging

    import dask

    import src_dask
    from src_dask import problems
    from src_dask._cluster import has_gpu
    from src_dask._oom import naming_the_site

    usage, monitoring, trouble = (ROOT / "docs" / n for n in
                                  ("usage.md", "monitoring.md", "troubleshooting.md"))

    def said(call, *args, **kwargs):
        with pytest.raises(Exception) as err:  # noqa: PT011 - the message is checked
            call(*args, **kwargs)
        return f"{type(err.value).__name__}: {err.value}"

    rng = np.random.default_rng(0)

    def mps(*shapes):
        return [rng.standard_normal(s) for s in shapes]

    mpo = mps((2, 2, 2), (2, 2, 2, 2), (2, 2, 2, 3), (2, 2, 2))  # site 2's down leg is 3
    x = mps((2, 2), (2, 2, 2), (2, 2, 2), (2, 2))
    shown = _quoted(usage, "site 2: trains[0] has a down (input) leg of size 3 but trains[1] "
                           "has an up (output) leg of size 2; they must match")
    assert said(src_dask.src, mpo, x, chi_out=4).endswith(": " + shown)
    bad = mps((2, 2), (2, 2, 2), (2, 2, 2), (3, 2, 2), (3, 2))  # site 2's right bond is 2
    shown = _quoted(usage, "trains[1], site 2: right bond 2 does not match the left bond 3 of "
                           "site 3")
    assert said(src_dask.src, mps((2, 2, 2), *[(2, 2, 2, 2)] * 3, (2, 2, 2)), bad,
                chi_out=4).endswith(": " + shown)
    A, psi = problems.random_mpo(8, bond=3, seed=1), problems.random_mps(8, bond=4, seed=2)
    assert "src(mps, mpo" in said(src_dask.apply, psi, A, chi_out=4).replace("src_dask.", "")
    assert "pass chi_out" in said(src_dask.apply, A, psi, max_bond=4)

    # a run that fails: the bar's last line, the log's
    nan = list(psi)
    nan[5] = nan[5] * np.nan
    bar = io.StringIO()
    with caplog.at_level(logging.INFO, logger="src_dask"):
        said(src_dask.apply, A, nan, chi_out=4, seed=0, progress=bar)
    assert _like(_quoted(monitoring, "`failed at pass …, site …`").strip("`"),
                 bar.getvalue().splitlines()[-1])
    assert _like(_quoted(monitoring, "`src: failed after … (ValueError)`").strip("`"),
                 caplog.text)

    shown = _quoted(monitoring, "`ValueError: performance_report needs a distributed Client "
                                "…`").strip("`")
    report = said(src_dask.apply, A, psi, chi_out=4, performance_report=str(tmp_path / "r.html"))
    assert _like(shown, report)
    assert _like(_quoted(trouble, "*`performance_report needs a distributed Client`*")
                 .strip("*`"), report)
    if not has_gpu():
        with dask.config.set({"src_dask.device": "gpu"}):
            assert _like(_quoted(trouble, "`dask config src_dask.device is 'gpu' but … has no "
                                          "usable GPU`").strip("`"),
                         said(src_dask.apply, A, psi, chi_out=4))

    def out_of_memory(*args):
        raise MemoryError("no room")

    # the one step that cannot be split (on the host here: a GPU's says "device memory")
    shown = _quoted(trouble, "`site j, pass 2's QR: out of device memory (…); this step is one "
                             "piece`").strip("`")
    got = said(naming_the_site(out_of_memory, site=3, step="pass 2's QR"), np.zeros(2))
    assert _like(shown.replace("site j", "site 3").replace("device", "host"), got)
    # a message made where the scheduler runs: quoted as the source writes it
    source = (ROOT / "src" / "src_dask" / "_progress.py").read_text()
    assert _quoted(trouble, "`progress: cannot follow the run on the scheduler`").strip("`") \
        in source
