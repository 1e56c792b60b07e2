"""``posenc compare``'s tasks come from one registry (``posenc.lab.task_registry.LAB_TASKS``): the
command's choices are its keys, each task's figure file and options are its entry's, and an option
a task does not read is refused, naming the option, before anything trains."""

import pytest

pytest.importorskip("torch")

from posenc.cli import build_parser, main  # noqa: E402
from posenc.lab.task_registry import LAB_TASKS, SEQUENCE_TASKS  # noqa: E402
from posenc.lab.tasks import TASKS  # noqa: E402

#: one argument list per task-only option, and the option's name in the error
OPTIONS = {
    "eval_lens": (["--eval-lens", "8,16"], "--eval-lens"),
    "seeds": (["--seeds", "2"], "--seeds"),
    "addition_order": (["--addition-order", "plain"], "--addition-order"),
    "rope_rules": (["--encodings", "rope,rope+yarn"], "rope+<rule>"),
}


def _choices(parser, name):
    sub = next(a for a in parser._subparsers._group_actions)
    compare = sub.choices["compare"]
    return next(a for a in compare._actions if a.dest == name).choices


def test_the_commands_task_choices_are_the_registry():
    assert tuple(_choices(build_parser(), "task")) == tuple(LAB_TASKS)
    assert set(SEQUENCE_TASKS) == set(TASKS) and set(SEQUENCE_TASKS) < set(LAB_TASKS)


def test_every_entry_is_complete():
    for name, task in LAB_TASKS.items():
        assert task.name == name and callable(task.run) and callable(task.format)
        assert (task.figure is None) == (task.figure_file is None)
        assert task.takes <= set(OPTIONS)
    assert {n for n, t in LAB_TASKS.items() if t.parallel} == {*SEQUENCE_TASKS, "extend"}


@pytest.mark.parametrize("task", list(LAB_TASKS))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_an_option_the_task_does_not_read_is_refused(tmp_path, capsys, task, option):
    if option in LAB_TASKS[task].takes:
        pytest.skip(f"--task {task} reads {option}")
    args, named = OPTIONS[option]
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--no-progress", "--out", str(tmp_path), "--task", task, *args])
    assert exc.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()
