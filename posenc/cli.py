"""Command line interface: ``posenc ...`` and ``python -m posenc ...``.

Data goes to stdout, messages to stderr.  Exit status: 0 on success, 2 for a bad command line
(the message names the option, the bad value and what is accepted), 1 when the work itself fails
(an output that cannot be written, a missing optional dependency).

Building the parser imports neither torch nor matplotlib: ``posenc --help``, ``posenc list`` and
``posenc table`` run on NumPy alone (``table`` uses the framework-free maths of
:mod:`posenc.core`), and ``compare`` and ``plot`` import torch only once they run.
"""

from __future__ import annotations

import argparse
import csv
import errno
import io
import json
import math
import os
import pathlib
import sys
import tempfile
from collections.abc import Callable, Sequence

import numpy as np

from posenc.core import sinusoidal as core_sinusoidal
from posenc.core.exact import MAX_POSITION
from posenc.core.sinusoidal import SINUSOIDAL_LAYOUTS
from posenc.lab.registry import DEFAULT_ENCODINGS, ENCODINGS
from posenc.lab.task_registry import LAB_TASKS, SEQUENCE_TASKS, CompareOptions, LabTask

FORMATS = ("torch", "csv", "json", "markdown")
#: Where ``posenc compare`` trains and evaluates.
DEVICES = ("cpu", "cuda")

#: Cells (rows x columns) a printed table or a plot may hold: 10**7 cells already make about
#: 200 MB of CSV or JSON text and need about 1 GB of memory to format.
MAX_CELLS = 10**7
#: Features per position: the exact frequencies are computed one by one in extended precision.
MAX_DIM = 2**16
#: Sequence lengths of ``compare``: attention memory grows with the square of the length (about
#: 7 GB to train at 2048 bytes with ``--quick``).
MAX_COMPARE_LEN = 4096
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1


class _WriteError(Exception):
    """An output could not be written: reported as ``posenc: cannot write PATH: REASON``, exit 1."""

    def __init__(self, path: object, err: OSError) -> None:
        self.path = str(path)
        self.err = err
        super().__init__(self.path)

    def message(self) -> str:
        reason = self.err.strerror or str(self.err)
        full = self.err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
        if self.path == "standard output":
            fix = "free some disk space or redirect the output elsewhere" if full else "check where the output goes"
        elif full:
            fix = "free some disk space or pass --out a folder on another disk"
        else:
            fix = "pass --out a folder you can write to"
        return f"posenc: cannot write {self.path}: {reason}; {fix}"


# ---------------------------------------------------------------------------------------------
# Argument types: each raises ArgumentTypeError, which argparse reports as
# "posenc CMD: error: argument --OPTION: MESSAGE" with exit status 2.


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {_shown(text)}") from None


def _int_range(lo: int, hi: int | None = None, *, accepted: str | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[lo, hi]`` (``hi`` None: no upper bound)."""
    if accepted is None:
        accepted = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"

    def parse(text: str) -> int:
        value = _parse_int(text)
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {accepted}, got {_shown(text)}")
        return value

    return parse


def _even_dim(text: str) -> int:
    accepted = f"an even integer from 2 to {MAX_DIM} (the figures include RoPE, which rotates features in pairs)"
    value = _int_range(2, MAX_DIM, accepted=accepted)(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"must be {accepted}, got {_shown(text)}; pass e.g. {value + 1}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {_shown(text)}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {_shown(text)}; pass e.g. 10000")
    return value


def _no_empty_entries(text: str, example: str) -> None:
    """A comma-separated list has no empty entry (two commas in a row, or one at either end)."""
    if text.strip() and any(not v.strip() for v in text.split(",")):
        raise argparse.ArgumentTypeError(
            f"an empty entry in {_shown(text)} (two commas in a row, or one at an end); pass e.g. {example}")


def _int_list(text: str) -> tuple[int, ...]:
    """Evaluation lengths: comma-separated integers from 1 to MAX_COMPARE_LEN."""
    _no_empty_entries(text, "64,128,256")
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {_shown(text)}; pass e.g. 64,128,256") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one length; pass e.g. 64,128,256")
    for v in values:
        if v < 1:
            raise argparse.ArgumentTypeError(f"lengths must be >= 1, got {v}; pass e.g. 64,128,256")
        if v > MAX_COMPARE_LEN:
            raise argparse.ArgumentTypeError(
                f"lengths must be <= {MAX_COMPARE_LEN} (attention memory grows with the square of the length), "
                f"got {v}")
    return values


def _name_list(text: str) -> tuple[str, ...]:
    """Encoding names: comma-separated, known, each at most once; ``rope+<rule>`` for the tasks."""
    from posenc.lab.lengthgen import ROPE_RULE_NAMES

    _no_empty_entries(text, "rope,alibi")
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    choose = (f"choose from {', '.join(ENCODINGS)} (and, with the copy, reverse, addition and passkey tasks, "
              f"rope+<rule> with rule one of {', '.join(ROPE_RULE_NAMES)})")
    if not names:
        raise argparse.ArgumentTypeError(f"no encoding given; {choose}")
    unknown = [n for n in names if n not in ENCODINGS and not (
        n.startswith("rope+") and n.partition("+")[2] in ROPE_RULE_NAMES)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown encoding(s) {', '.join(unknown)}; {choose}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(twice)} given more than once; name each encoding once")
    return names


def _folder(text: str) -> pathlib.Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty; pass a folder path")
    return pathlib.Path(text)


# ---------------------------------------------------------------------------------------------
# Output.


def _emit(text: str) -> None:
    """Print data to stdout; a write error (other than a closed pipe) becomes a _WriteError."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        raise _WriteError("standard output", err) from err


def _prepare_folder(out: pathlib.Path, files: Sequence[str]) -> None:
    """Create ``out`` and check that ``files`` can be written in it, before any long work."""
    try:
        if out.exists() and not out.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(out))
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            if (out / name).is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(out / name))
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise _WriteError(err.filename or out, err) from err


def _write_text(path: pathlib.Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as err:
        try:
            path.unlink(missing_ok=True)                     # no truncated file left behind
        except OSError:
            pass
        raise _WriteError(path, err) from err


# ---------------------------------------------------------------------------------------------
# Optional dependencies.

_NEEDS_TORCH = {"compare": "trains and evaluates models with PyTorch",
                "plot": "computes the encodings it draws with PyTorch"}


def _torch_missing(command: str) -> str | None:
    """The message for ``command`` when PyTorch cannot be imported, else None."""
    try:
        import torch  # noqa: F401
    except ImportError as err:
        return (f"posenc {command}: error: this command {_NEEDS_TORCH[command]}, which cannot be "
                f"imported ({err}); install it with pip install torch (in a clone of posenc: pip install "
                "\".[torch]\"). posenc table, posenc list and --help work without it")
    return None


# ---------------------------------------------------------------------------------------------
# posenc table: NumPy only, printed exactly as torch prints the same float32 tensor.

#: torch's default print options: digits, elements before summarising, edge items, line width.
_PRECISION, _THRESHOLD, _EDGE_ITEMS, _LINE_WIDTH = 4, 1000, 3, 80


class _CellFormat:
    """How torch's ``repr`` writes the numbers of one float tensor (default print options).

    One format for all cells: fixed point with 4 decimals, integers with a trailing dot when every
    finite nonzero value is a whole number, scientific notation when those values span more than
    a factor 1000 or leave [1e-4, 1e8]; every cell padded to the widest one.
    """

    def __init__(self, values: Sequence[float]) -> None:
        finite = [abs(v) for v in values if math.isfinite(v) and v != 0.0]
        self.width = 1
        self.whole = all(v == math.ceil(v) for v in finite)
        self.scientific = False
        if not finite:
            return
        low, high = min(finite), max(finite)
        self.scientific = high / low > 1000.0 or high > 1.0e8 or low < 1.0e-4
        nonzero = [v for v in values if math.isfinite(v) and v != 0.0]
        if self.scientific:
            self.width = max(len(f"{v:.{_PRECISION}e}") for v in nonzero)
        elif self.whole:
            self.width = max(len(f"{v:.0f}") + 1 for v in nonzero)
        else:
            self.width = max(len(f"{v:.{_PRECISION}f}") for v in nonzero)
        self.width = max(self.width, 1)

    def __call__(self, value: float) -> str:
        if self.scientific:
            text = f"{value:{self.width}.{_PRECISION}e}"
        elif self.whole:
            text = f"{value:.0f}" + ("" if math.isinf(value) or math.isnan(value) else ".")
        else:
            text = f"{value:.{_PRECISION}f}"
        return text.rjust(self.width)


def _edges(n: int, summarize: bool) -> list[int] | None:
    """Indices shown along an axis of ``n`` (None: all of them)."""
    return [*range(_EDGE_ITEMS), *range(n - _EDGE_ITEMS, n)] if summarize and n > 2 * _EDGE_ITEMS else None


def torch_style(table: np.ndarray) -> str:
    """``repr`` of ``table`` (2-D, float32) as torch prints the same tensor, without torch.

    Examples:
        >>> print(torch_style(np.array([[0.0, 1.0], [0.841471, 0.540302]], dtype=np.float32)))
        tensor([[0.0000, 1.0000],
                [0.8415, 0.5403]])
    """
    rows, cols = table.shape
    if table.size == 0:
        return f"tensor([], size=({rows}, {cols}))"
    summarize = table.size > _THRESHOLD
    row_ids, col_ids = _edges(rows, summarize), _edges(cols, summarize)
    shown = table if row_ids is None else table[row_ids]
    shown = shown if col_ids is None else shown[:, col_ids]
    fmt = _CellFormat(shown.astype(np.float64).ravel().tolist())
    indent = len("tensor(") + 1                                        # rows start after "tensor(["
    per_line = max(1, (_LINE_WIDTH - indent) // (fmt.width + 2))

    def row_text(values: list[float]) -> str:
        cells = [fmt(v) for v in values]
        if col_ids is not None:
            cells = [*cells[:_EDGE_ITEMS], " ...", *cells[_EDGE_ITEMS:]]
        lines = [", ".join(cells[i : i + per_line]) for i in range(0, len(cells), per_line)]
        return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"

    texts = [row_text(r) for r in shown.astype(np.float64).tolist()]
    if row_ids is not None:
        texts = [*texts[:_EDGE_ITEMS], "...", *texts[_EDGE_ITEMS:]]
    return "tensor([" + ("," + "\n" + " " * indent).join(texts) + "])"


def sinusoidal_rows(length: int, dim: int, *, base: float, layout: str, offset: int) -> np.ndarray:
    """The float32 ``(length, dim)`` table that :func:`posenc.sinusoidal_table` returns, in NumPy.

    Both compute the angles exactly in float64 (:mod:`posenc.core.exact`) and round once to
    float32, so the values are the same with and without torch.
    """
    positions = np.arange(offset, offset + length, dtype=np.int64)                 # (P,)
    return core_sinusoidal.table(positions, dim, base, layout).astype(np.float32)  # (P, D)


def _format_table(table: np.ndarray, fmt: str, offset: int) -> str:
    if fmt == "torch":
        return torch_style(table)
    rows = table.astype(np.float64).tolist()
    if fmt == "json":
        return json.dumps({"offset": offset, "rows": rows})
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["position", *[f"d{j}" for j in range(table.shape[1])]])
        for i, row in enumerate(rows):
            writer.writerow([offset + i, *[repr(v) for v in row]])
        return buf.getvalue().rstrip("\n")
    head = "| position | " + " | ".join(f"d{j}" for j in range(table.shape[1])) + " |"
    rule = "|---:|" + "---:|" * table.shape[1]
    body = [f"| {offset + i} | " + " | ".join(f"{v:.4f}" for v in row) + " |" for i, row in enumerate(rows)]
    return "\n".join([head, rule, *body])


def _check_table(args: argparse.Namespace) -> str | None:
    cells = max(args.max_len, 1) * args.dim
    if cells > MAX_CELLS:
        return (f"--max-len {args.max_len} x --dim {args.dim} = {cells:,} cells, more than the {MAX_CELLS:,} "
                f"this command prints; lower --max-len or --dim (posenc.sinusoidal_table builds larger tables in Python)")
    last = args.offset + args.max_len - 1
    if args.max_len and last > MAX_POSITION:
        return (f"--offset {args.offset} with --max-len {args.max_len} reaches position {last}, beyond 2**31 = "
                f"{MAX_POSITION} where angles are no longer exact; lower --offset to at most "
                f"{MAX_POSITION - args.max_len + 1} or lower --max-len")
    return None


def _cmd_table(args: argparse.Namespace) -> int:
    table = sinusoidal_rows(args.max_len, args.dim, base=args.base, layout=args.layout, offset=args.offset)
    _emit(_format_table(table, args.format, args.offset))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from posenc.lab.registry import list_encodings

    width = max(len(e.name) for e in list_encodings())
    _emit("\n".join(f"{e.name:<{width}}  {e.family:<8}  {e.description}" for e in list_encodings()))
    return 0


# ---------------------------------------------------------------------------------------------
# posenc compare and posenc plot: torch (and matplotlib for the figures).


def _check_compare(args: argparse.Namespace) -> str | None:
    if args.device == "cuda":
        try:
            import torch
        except ImportError:
            return None                              # reported by the command: PyTorch is missing
        if not torch.cuda.is_available():
            return ("argument --device: got 'cuda' but no CUDA device is visible to PyTorch "
                    f"(torch {torch.__version__}, torch.cuda.is_available() is False); pass --device cpu, or "
                    "install a CUDA build of PyTorch and check CUDA_VISIBLE_DEVICES")
    return None


def _choose_threads(args: argparse.Namespace) -> tuple[int, str]:
    """``--threads`` if given, else the free cores; the line printed says which."""
    from posenc.lab.pool import auto_threads

    if args.threads is not None:
        return args.threads, f"--threads {args.threads}"
    threads, why = auto_threads()
    return threads, f"automatic: {why}; --threads overrides"


#: Why a task-only option does not apply to a task (the task's registry entry says which it takes).
_TASK_ONLY = {
    "eval_lens": lambda task: f"argument --eval-lens: lm only; --task {task} tests at its own lengths "
                              "(the tasks at 1x to 8x, extend at 1x to 16x the training length)",
    "seeds": lambda task: f"argument --seeds: for the tasks and extend; --task {task} trains one model per encoding "
                          "from --seed",
    "addition_order": lambda task: f"argument --addition-order: for --task addition only, not --task {task}",
    "rope_rules": lambda task: f"argument --encodings: rope+<rule> is for the tasks {', '.join(SEQUENCE_TASKS)}; "
                               "--task lm evaluates every rule on the rope model already",
}


def _check_task_options(args: argparse.Namespace, task: LabTask, encodings: tuple[str, ...]) -> None:
    """Refuse an option the task does not read, naming it, instead of ignoring it."""
    given = {"eval_lens": args.eval_lens is not None, "seeds": args.seeds is not None,
             "addition_order": args.addition_order is not None, "rope_rules": any("+" in n for n in encodings)}
    for option, why in _TASK_ONLY.items():
        if given[option] and option not in task.takes:
            args.command_parser.error(why(task.name))
    if task.parallel and args.device != "cpu":
        args.command_parser.error(f"argument --device: --task {task.name} runs on the CPU only (one thread per "
                                  "job, so that results repeat to the last digit); pass --device cpu")
    if task.name in SEQUENCE_TASKS and args.train_len is not None:
        from posenc.lab.lengthgen import largest_train_size

        largest = largest_train_size(task.name, reverse_answer=args.addition_order != "plain")
        if args.train_len > largest:
            args.command_parser.error(
                f"argument --train-len: {args.train_len} is too large for --task {task.name}: its test at 8x would "
                f"be longer than {MAX_COMPARE_LEN} tokens; pass at most {largest}")


def _cmd_compare(args: argparse.Namespace) -> int:
    problem = _torch_missing("compare")
    if problem:
        print(problem, file=sys.stderr)
        return 1
    out, task = args.out, LAB_TASKS[args.task]
    _prepare_folder(out, ["results.json", *([task.figure_file] if task.figure_file else [])])  # before the training
    encodings = args.encodings if args.encodings is not None else DEFAULT_ENCODINGS
    _check_task_options(args, task, encodings)
    threads, why = _choose_threads(args)
    if task.parallel:
        print(f"posenc compare: {threads} worker(s) of 1 thread ({why}); the results do not depend on it",
              file=sys.stderr)
    else:
        print(f"posenc compare: {threads} thread(s) ({why})", file=sys.stderr)
    options = CompareOptions(encodings, quick=args.quick, train_len=args.train_len, steps=args.steps, seed=args.seed,
                             seeds=args.seeds, eval_lens=args.eval_lens, addition_order=args.addition_order,
                             device=args.device, threads=threads, threads_note=why, progress=not args.no_progress)
    results = task.run(options)
    _emit(task.format(results))                                     # shown even if the disk is full
    _write_text(out / "results.json", json.dumps(results, indent=1) + "\n")
    took = results.get("wall_seconds", results.get("seconds"))
    print(f"wrote {out / 'results.json'}" + ("" if took is None else f" ({took} s)"), file=sys.stderr)
    if task.figure is None:
        return 0
    try:
        from posenc.lab.plots import save_figure

        png = save_figure(task.figure(results), out / task.figure_file)
    except ImportError as err:
        print(f"posenc compare: no plot: {err}", file=sys.stderr)
        return 0
    except OSError as err:
        raise _WriteError(err.filename or out / task.figure_file, err) from err
    print(f"wrote {png}", file=sys.stderr)
    return 0


def _check_plot(args: argparse.Namespace) -> str | None:
    cells = (4 * args.max_len + 1) * args.dim
    if cells > MAX_CELLS:
        return (f"--max-len {args.max_len} x --dim {args.dim} is too large: the figures compute 4 x --max-len + 1 "
                f"positions x --dim features = {cells:,} values, more than {MAX_CELLS:,}; lower --max-len or --dim")
    return None


def _cmd_plot(args: argparse.Namespace) -> int:
    problem = _torch_missing("plot")
    if problem:
        print(problem, file=sys.stderr)
        return 1
    from posenc.lab.plots import plot_encodings, require_matplotlib

    try:
        require_matplotlib()
    except ImportError as err:
        print(f"posenc plot: error: {err}", file=sys.stderr)
        return 1
    _prepare_folder(args.out, ["sinusoidal_table.png", "similarity_vs_distance.png", "logits_vs_distance.png",
                               "sincos_2d_table.png", "axial_similarity.png"])
    try:
        paths = plot_encodings(args.out, dim=args.dim, length=args.max_len)
    except OSError as err:
        raise _WriteError(err.filename or args.out, err) from err
    _emit("\n".join(str(p) for p in paths))
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    problem = _torch_missing("audit")
    if problem:
        print(problem, file=sys.stderr)
        return 1
    from posenc.testing.audit import audit_hf

    report = audit_hf(args.config, inspect_modules=not args.no_modules, max_position=args.max_position)
    _emit(str(report))
    return 0 if report.ok else 1


# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``posenc`` argument parser (imports neither torch nor matplotlib)."""
    import posenc  # the package itself: its version, nothing more

    parser = argparse.ArgumentParser(
        prog="posenc", description="Positional encodings for Transformers.",
        epilog="table, list and --help need only NumPy; compare and plot need PyTorch (pip install torch), "
               "and their figures matplotlib (pip install matplotlib); in a clone of posenc, pip install "
               '".[torch,plot]" installs both (once posenc is on PyPI: pip install "posenc[torch,plot]"). '
               "Exit status: 0 "
               "success, 1 the work failed (an output that cannot be written, a missing dependency), 2 a bad "
               "command line.")
    parser.add_argument("--version", action="version", version=f"posenc {posenc.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="print a sinusoidal positional-encoding table")
    t.add_argument("--dim", type=_int_range(1, MAX_DIM), required=True,
                   help=f"features per position (d_model), from 1 to {MAX_DIM}, odd included")
    t.add_argument("--max-len", type=_int_range(0, MAX_CELLS), required=True,
                   help=f"number of positions (rows), 0 or more; --max-len x --dim at most {MAX_CELLS:,}")
    t.add_argument("--base", type=_positive_float, default=10000.0, help="frequency base, > 0 (default 10000)")
    t.add_argument("--layout", choices=SINUSOIDAL_LAYOUTS, default="interleaved", help="column convention")
    t.add_argument("--offset", default=0, type=_int_range(
                       -MAX_POSITION, MAX_POSITION, accepted="an integer from -2**31 to 2**31 (beyond, angles are no "
                       "longer exact)"),
                   help="position of the first row (default 0); every position must lie within [-2**31, 2**31]")
    t.add_argument("--format", choices=FORMATS, default="torch", help="output format (torch prints like the seeds)")
    t.set_defaults(func=_cmd_table, check=_check_table, command_parser=t)

    ls = sub.add_parser("list", help="list the registered encodings")
    ls.set_defaults(func=_cmd_list, command_parser=ls)

    c = sub.add_parser("compare", help="train a tiny Transformer per encoding and measure it past its training length")
    c.add_argument("--encodings", type=_name_list, default=None,
                   help=f"comma-separated names (default: {','.join(DEFAULT_ENCODINGS)}; also: "
                        f"{','.join(n for n in ENCODINGS if n not in DEFAULT_ENCODINGS)}); the tasks copy, reverse, "
                        "addition and passkey also take rope+<rule>, the rope model with a rule at inference")
    c.add_argument("--train-len", type=_int_range(1, MAX_COMPARE_LEN), default=None,
                   help=f"training length, from 1 to {MAX_COMPARE_LEN}: bytes for lm and extend (default 64 and "
                        "32), the largest training size for the tasks (default copy/reverse 8 items, addition 3 "
                        "digits, passkey 24 filler tokens; at most 255, 170 and 510, so that the test at 8x fits "
                        f"{MAX_COMPARE_LEN} tokens)")
    c.add_argument("--eval-lens", type=_int_list, default=None,
                   help=f"lm only: evaluation lengths, each from 1 to {MAX_COMPARE_LEN} (default 64,128,256,512); "
                        "the tasks test at 1x, 2x, 4x, 8x and extend at 1x to 16x the training length")
    c.add_argument("--steps", type=_int_range(1), default=None,
                   help="training steps per model, >= 1 (default: lm 1000, or 400 with --quick; position 400 or "
                        "150; copy, reverse, addition 3000 or 1000; passkey 2000 or 600; extend 1500 or 800 "
                        "before fine-tuning)")
    c.add_argument("--seed", default=0, help="random seed, a 64-bit signed integer (default 0); the tasks and "
                   "extend use --seeds seeds from it", type=_int_range(
                       _SEED_MIN, _SEED_MAX - 16, accepted="a 64-bit signed integer, from -2**63 to 2**63 - 17"))
    c.add_argument("--seeds", type=_int_range(1, 16), default=None,
                   help="tasks and extend: how many seeds (--seed, --seed + 1, ...), from 1 to 16 (default 3)")
    c.add_argument("--out", type=_folder, default=pathlib.Path("posenc-compare"),
                   help="folder for results.json and the figure (compare.png, or TASK.png), created if missing "
                        "(default posenc-compare)")
    c.add_argument("--quick", action="store_true",
                   help="a smaller model and budget (lm: 400 steps, width 64, depth 2; each task and extend: under "
                        "200 CPU-seconds, about 100 s on 2 idle cores)")
    c.add_argument("--task", choices=tuple(LAB_TASKS), default="lm",
                   help="lm: language modelling past the training length; position: bidirectional order task; "
                        "copy, reverse, addition, passkey: exact match at 1x-8x the training size; extend: "
                        "fine-tuning a RoPE model with each context-extension rule")
    c.add_argument("--addition-order", choices=("reversed", "plain"), default=None,
                   help="addition: the sum written least significant digit first (reversed, default: each "
                        "digit then depends on the carry already written) or as usual (plain)")
    c.add_argument("--device", choices=DEVICES, default="cpu",
                   help="lm and position: where the models train and run: cpu (default) or cuda; the "
                        "batches are drawn on the CPU either way, so a seed selects the same data")
    c.add_argument("--threads", type=_int_range(1, 1024), default=None,
                   help="CPU threads, from 1 to 1024 (default: the free cores, usable cores minus the load "
                        "average, at least 1; printed). lm and position: torch threads, and a seed repeats "
                        "results bit for bit only at the same count; tasks and extend: jobs run side by side, "
                        "one thread each, and the results do not depend on the count")
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.set_defaults(func=_cmd_compare, check=_check_compare, command_parser=c)

    p = sub.add_parser("plot", help="write six PNG figures that explain the encodings",
                       description="Write six PNG figures that explain the encodings. The two patch-grid figures "
                                   "(sincos_2d_table.png, axial_similarity.png) always show a 16 x 16 grid with "
                                   "64 features, and context_parallel_shards.png 32 tokens over 4 ranks; --dim "
                                   "and --max-len set the three 1-D figures.")
    p.add_argument("--out", type=_folder, default=pathlib.Path("posenc-plots"),
                   help="folder for the PNG files, created if missing (default posenc-plots)")
    p.add_argument("--dim", type=_even_dim, default=64, help=f"features per position, even, from 2 to {MAX_DIM} (default 64)")
    p.add_argument("--max-len", type=_int_range(1, MAX_CELLS), default=128,
                   help="positions in the table figure and distances in the logit figure, >= 1; the "
                        "similarity figure shows distances up to 4 x --max-len - 1 (default 128)")
    p.set_defaults(func=_cmd_plot, check=_check_plot, command_parser=p)

    a = sub.add_parser("audit", help="say what positions each layer of a Hugging Face model gets, and check it",
                       description="Read a Hugging Face config.json (or a model folder holding one) and print what "
                                   "positions each layer gets, flag fields that contradict each other or that the "
                                   "model's code ignores, and, with transformers installed, build the model's rotary "
                                   "modules from the config (no weights are read) and check what they compute "
                                   "against it. Exit status 1 when something is flagged.")
    a.add_argument("config", help="a config.json, or a folder holding one")
    a.add_argument("--no-modules", action="store_true", help="read the config only; do not build rotary modules")
    a.add_argument("--max-position", type=_int_range(16, 1 << 20), default=2048,
                   help="last position the rotary modules are probed at, from 16 to 1048576 (default 2048)")
    a.set_defaults(func=_cmd_audit, check=None, command_parser=a)
    return parser


def _quiet_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass                                                      # stdout replaced (tests): nothing to do


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check = getattr(args, "check", None)
    problem = check(args) if check is not None else None
    if problem:
        args.command_parser.error(problem)                        # exits with status 2
    try:
        return args.func(args)
    except (TypeError, ValueError) as err:
        # The options are checked above; this reports a value posenc itself rejects.
        print(f"posenc {args.command}: error: {err}", file=sys.stderr)
        return 2
    except _WriteError as err:
        if err.path == "standard output":
            _quiet_stdout()
        print(err.message(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        _quiet_stdout()                                           # e.g. `posenc table ... | head`: stop quietly
        return 1
    except KeyboardInterrupt:
        print(f"posenc {args.command}: interrupted", file=sys.stderr)
        return 130
