"""Seams a fuzzer found where users arrive: each is a clear error naming the argument, or the right result."""

import sys

import pytest
import torch

import posenc
from posenc.cli import main
from posenc.lab.tasks import addition_example


@pytest.mark.parametrize("name", ["window", "chunk"])
def test_a_window_or_chunk_past_any_sequence_is_a_clear_error(name):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=rf"{name}=1180591620717411303424 is larger than any sequence"):
        posenc.attention(q, q, q, **{name: 2**70})
    out = posenc.attention(q, q, q, causal=True, **{name: 2**62})        # the largest: full causal attention
    assert torch.allclose(out, posenc.attention(q, q, q, causal=True), atol=1e-6)


def test_addition_of_thousands_of_digits_is_exact():
    a, b = "9" * 5000, "1" + "0" * 4999                     # past Python's int-to-string digit limit (4300)
    answer = addition_example(a, b, reverse_answer=False).answer[:-1]          # (the last token is EOS)
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        want = str(int(a) + int(b)).rjust(5001, "0")       # the oracle: Python's big integers
    finally:
        sys.set_int_max_str_digits(limit)
    assert "".join(map(str, answer)) == want


@pytest.mark.parametrize("argv, message", [
    (["compare", "--encodings", "rope,,alibi"], "argument --encodings: an empty entry in 'rope,,alibi'"),
    (["compare", "--eval-lens", "64,"], "argument --eval-lens: an empty entry in '64,'"),
    (["compare", "--task", "copy", "--eval-lens", "16,32"], "argument --eval-lens: lm only; --task copy"),
    (["compare", "--task", "copy", "--addition-order", "plain"], "argument --addition-order: for --task addition"),
    (["compare", "--task", "lm", "--seeds", "2"], "argument --seeds: for the tasks and extend; --task lm"),
    (["compare", "--task", "addition", "--train-len", "4096"],
     "argument --train-len: 4096 is too large for --task addition: its test at 8x would be longer than 4096 "
     "tokens; pass at most 170"),
])
def test_compare_refuses_options_it_would_ignore_or_cannot_run(capsys, tmp_path, argv, message):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err


def test_the_largest_train_len_of_a_task_builds_and_one_more_does_not():
    from posenc.lab.lengthgen import TaskConfig, largest_train_size

    largest = largest_train_size("addition")
    TaskConfig(task="addition", train_size=largest)
    with pytest.raises(ValueError, match=f"train_size={largest + 1} is too large for the addition task"):
        TaskConfig(task="addition", train_size=largest + 1)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("encoding", [None, "alibi", "t5"])
def test_an_infinite_sink_logit_takes_all_the_weight(backend, encoding):
    """As the sink logit grows the real keys' weights go to 0 and, the sink's value being zero, so does the
    output; +inf gives that limit, not NaN."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    enc = {None: None, "alibi": posenc.AlibiBias(2), "t5": posenc.RelativePositionBias(2)}[encoding]
    sinks = torch.tensor([float("inf"), 0.0])
    with torch.no_grad():                                   # (flex takes trainable biases only without autograd)
        out = posenc.attention(q, k, v, encoding=enc, causal=True, sinks=sinks, backend=backend)
        big = posenc.attention(q, k, v, encoding=enc, causal=True, sinks=torch.tensor([60.0, 0.0]), backend=backend)
    assert not torch.isnan(out).any()
    assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))                  # head 0: all weight on the sink
    assert torch.allclose(out[:, 1], big[:, 1]) and big[:, 0].abs().max() < 1e-20   # the limit it approaches


def test_flex_compiles_once_for_ten_windows_and_chunks():
    """Windows and chunks reach flex_attention's mask as data: one compiled kernel serves every value (a value
    captured as a Python int would compile once per value, and past 8 fall back to the unfused path)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    q = torch.randn(1, 2, 40, 16)
    for name in ("window", "chunk"):
        torch._dynamo.reset()
        counters.clear()
        for value in range(3, 13):
            out = posenc.attention(q, q, q, causal=True, backend="flex", **{name: value})
            assert torch.allclose(out, posenc.attention(q, q, q, causal=True, backend="sdpa", **{name: value}),
                                  atol=1e-5)
        assert counters["stats"]["unique_graphs"] == 1, name


def test_alibi_attention_compiles_one_graph_for_every_length_with_dynamic_shapes():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    enc = posenc.AlibiBias(4)
    compiled = torch.compile(lambda q: posenc.attention(q, q, q, encoding=enc, causal=True), dynamic=True,
                             fullgraph=True, backend="eager")
    for n in (6, 9, 13):
        q = torch.randn(1, 4, n, 16)
        assert torch.allclose(compiled(q), posenc.attention(q, q, q, encoding=enc, causal=True), atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1


def test_the_compare_figure_gives_every_registered_encoding_its_own_colour_and_line():
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    from posenc.lab.lengthgen import ROPE_RULE_NAMES
    from posenc.lab.plots import compare_figure, encoding_styles
    from posenc.lab.registry import ENCODINGS

    names = [*ENCODINGS, *(f"rope+{r}" for r in ROPE_RULE_NAMES)]
    styles = encoding_styles(names)
    assert len({color for color, _, _ in styles.values()}) == len(names)            # one colour each
    assert len({(m, ls) for _, m, ls in styles.values()}) == len(names)             # one marker/line pair each
    # the figure draws them so: fire, kerple_log and sandwich (once one grey solid line) are apart
    results = {"config": {"train_len": 64, "seed": 0, "steps": 1},
               "loss": {n: {"64": 1.0 + i / 10, "128": 2.0 + i / 10} for i, n in enumerate(names)}}
    fig = compare_figure(results)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines() if line.get_label() in names}
    drawn = {(line.get_color(), line.get_marker(), line.get_linestyle()) for line in lines.values()}
    assert len(lines) == len(names) and len(drawn) == len(names)
    assert len({lines[n].get_color() for n in ("fire", "kerple_log", "sandwich", "alibi")}) == 4
