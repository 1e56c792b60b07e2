"""posenc.lab tasks: generators against hand-written examples, the metric, determinism, results.json."""

import json
import random

import pytest

from posenc.lab.pool import auto_threads
from posenc.lab.tasks import (
    ASK,
    BOS,
    EOS,
    KEY,
    PLUS,
    SEP,
    TASKS,
    VOCAB_SIZE,
    addition_example,
    copy_example,
    exact_match,
    passkey_example,
    reverse_example,
    sample_example,
    token_accuracy,
)

# ---- generators, checked by hand ------------------------------------------------------------------


def test_copy_and_reverse_by_hand():
    c = copy_example("3051")
    assert c.tokens == (BOS, 3, 0, 5, 1, SEP, 3, 0, 5, 1, EOS)
    assert c.answer == (3, 0, 5, 1, EOS)
    r = reverse_example([3, 0, 5, 1])
    assert r.tokens[: r.answer_start] == (BOS, 3, 0, 5, 1, SEP)
    assert r.answer == (1, 5, 0, 3, EOS)


def test_addition_123_plus_989_by_hand():
    # 123 + 989 = 1112; written least significant digit first: 2 1 1 1
    e = addition_example("123", "989")
    assert e.tokens[: e.answer_start] == (BOS, 1, 2, 3, PLUS, 9, 8, 9, SEP)
    assert e.answer == (2, 1, 1, 1, EOS)
    assert addition_example("123", "989", reverse_answer=False).answer == (1, 1, 1, 2, EOS)


def test_addition_without_carry_out_keeps_a_leading_zero():
    # 12 + 34 = 46 on 3 digits: 046, reversed 640
    assert addition_example("12", "34").answer == (6, 4, 0, EOS)
    assert addition_example("12", "34", reverse_answer=False).answer == (0, 4, 6, EOS)
    assert addition_example("99", "01").answer == (0, 0, 1, EOS)      # 100


def test_passkey_by_hand():
    e = passkey_example("90210", filler=6, where=4)
    assert e.tokens == (BOS, 16, 17, 18, 19, KEY, 9, 0, 2, 1, 0, 16, 17, ASK, 9, 0, 2, 1, 0, EOS)
    assert e.answer == (9, 0, 2, 1, 0, EOS)
    assert passkey_example("1", filler=0, where=0).tokens == (BOS, KEY, 1, ASK, 1, EOS)


@pytest.mark.parametrize("task", list(TASKS))
def test_sample_is_a_function_of_the_seed(task):
    a = [sample_example(task, random.Random("s"), n) for n in (1, 4, 9)]
    b = [sample_example(task, random.Random("s"), n) for n in (1, 4, 9)]
    assert a == b
    c = [sample_example(task, random.Random("t"), n) for n in (1, 4, 9)]
    assert a != c
    for e in a:
        assert e.tokens[-1] == EOS and max(e.tokens) < VOCAB_SIZE and e.tokens[0] == BOS


@pytest.mark.parametrize("n", [1, 3, 7])
def test_sampled_addition_answer_is_the_sum(n):
    rng = random.Random(n)
    for _ in range(50):
        e = sample_example("addition", rng, n)
        prompt = e.tokens[1 : e.answer_start - 1]
        plus = prompt.index(PLUS)
        a = int("".join(map(str, prompt[:plus])))
        b = int("".join(map(str, prompt[plus + 1 :])))
        digits = e.answer[:-1]
        assert len(digits) == n + 1
        assert int("".join(map(str, digits[::-1]))) == a + b


def test_sampled_passkey_answer_is_the_key():
    rng = random.Random(0)
    for _ in range(50):
        e = sample_example("passkey", rng, 10)
        k = e.tokens.index(KEY)
        assert e.tokens[k + 1 : k + 6] == e.answer[:-1]
        assert len(e.tokens) == 1 + 10 + 1 + 5 + 1 + 5 + 1


# ---- the metric, on hand-built predictions ----------------------------------------------------------


def test_exact_match_and_token_accuracy_by_hand():
    targets = [[2, 1, 1, 1, EOS], [0, 4, 6, EOS, EOS], [5, 5, 5, 5, EOS]]
    preds = [[2, 1, 1, 1, EOS],        # right
             [0, 4, 6, EOS, 3],        # one token wrong: the row fails
             [5, 5, 5, 5, EOS]]        # right
    assert exact_match(preds, targets) == pytest.approx(2 / 3)
    assert token_accuracy(preds, targets) == pytest.approx(14 / 15)
    assert exact_match(targets, targets) == 1.0
    assert exact_match([[9] * 5] * 3, targets) == 0.0


# ---- thread choice ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("cores", "load", "want"), [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 10.0, 1),
                                                     (16, 3.2, 13), (1, 0.0, 1)])
def test_auto_threads(cores, load, want):
    threads, why = auto_threads(cores=cores, load=load)
    assert threads == want
    assert f"{want} of {cores} cores free" in why


# ---- tiny runs: determinism and the results schema ---------------------------------------------------

torch = pytest.importorskip("torch")

from posenc.lab.lengthgen import ROPE_RULE_NAMES, TaskConfig, run_task  # noqa: E402


def _tiny(task="copy", **kw):
    base = dict(task=task, encodings=("rope", "rope+yarn", "alibi"), train_size=3, multipliers=(1, 2), steps=6,
                batch_size=4, dim=16, depth=1, num_heads=2, eval_examples=8, seeds=(0, 1))
    base.update(kw)
    return TaskConfig(**base)


def test_rope_rule_names_match_the_rules():
    from posenc.lab.experiment import ROPE_RULES

    assert ROPE_RULE_NAMES == tuple(ROPE_RULES)


@pytest.mark.parametrize("task", list(TASKS))
def test_tiny_task_run_repeats_exactly_and_has_the_schema(task):
    a = run_task(_tiny(task), progress=False)
    b = run_task(_tiny(task), progress=False)
    assert a["per_seed"] == b["per_seed"] and a["final_train_loss"] == b["final_train_loss"]
    assert json.loads(json.dumps(a))["per_seed"] == a["per_seed"]                      # JSON-safe
    assert set(a) >= {"task", "config", "metrics", "versions", "per_seed", "summary", "threads", "wall_seconds"}
    assert {m: d["better"] for m, d in a["metrics"].items()} == {
        "exact_match": "higher", "token_accuracy": "higher", "final_train_loss": "lower"}
    assert set(a["versions"]) >= {"python", "posenc", "torch"}
    for metric in ("exact_match", "token_accuracy"):
        assert list(a["summary"][metric]) == ["rope", "rope+yarn", "alibi"]
        for name, seeds in a["per_seed"][metric].items():
            assert set(seeds) == {"0", "1"}
            for by_size in seeds.values():
                assert set(by_size) == {"3", "6"}
                assert all(0.0 <= v <= 1.0 for v in by_size.values())
            s = a["summary"][metric][name]["6"]
            vals = [seeds[k]["6"] for k in seeds]
            assert s["min"] == min(vals) and s["max"] == max(vals)
            assert s["mean"] == pytest.approx(sum(vals) / 2)
    # at 1x the rule is not applied (factor <= 1 there): rope and rope+yarn agree
    assert a["per_seed"]["exact_match"]["rope"]["0"]["3"] == a["per_seed"]["exact_match"]["rope+yarn"]["0"]["3"]


def test_a_trained_model_scores_what_it_predicts():
    # copy at size 1 is learnable in a few hundred steps; the score must then be near 1 at 1x
    cfg = _tiny("copy", encodings=("rope",), train_size=1, multipliers=(1,), steps=150, dim=32, batch_size=16,
                seeds=(0,), lr=1e-2, eval_examples=50)
    res = run_task(cfg, progress=False)
    assert res["per_seed"]["exact_match"]["rope"]["0"]["1"] >= 0.9


@pytest.mark.slow
def test_worker_processes_give_the_same_numbers():
    one = run_task(_tiny(workers=1), progress=False)
    two = run_task(_tiny(workers=2), progress=False)
    assert one["per_seed"] == two["per_seed"]
    assert one["final_train_loss"] == two["final_train_loss"]


def test_extend_tiny_run_repeats_and_has_the_schema():
    from posenc.lab.extend import EXTEND_RULES, ExtendConfig, run_extend

    cfg = ExtendConfig(train_len=8, factor=2, multipliers=(1, 2, 4), steps=4, finetune_steps=3, checkpoints=(0, 1),
                       budgets=(0, 3), batch_size=2, dim=16, depth=1, num_heads=2, eval_windows=2,
                       corpus_bytes=200_000, seeds=(0,))
    a = run_extend(cfg, progress=False)
    b = run_extend(cfg, progress=False)
    assert a["summary"] == b["summary"]
    assert list(a["summary"]) == list(EXTEND_RULES)
    assert {m: d["better"] for m, d in a["metrics"].items()} == {"loss": "lower", "steps_to_target": "lower"}
    for s in a["summary"].values():
        assert set(s["loss"]) == {"0", "3"}
        assert set(s["loss"]["3"]) == {"8", "16", "32"}
        assert set(s["loss_at_finetune_len"]) == {"0", "1", "3"}
        assert len(s["steps_to_target"]) == 1
    # before fine-tuning, plain RoPE is the base model on the same windows: its loss at the training
    # length is the target; PI changes every frequency, so it differs
    s0 = {r: a["summary"][r]["loss"]["0"]["8"]["mean"] for r in EXTEND_RULES}
    assert s0["rope"] == a["target_loss"]["0"]
    assert s0["linear"] != s0["rope"]
    json.dumps(a)


def test_lm_results_record_versions():
    from posenc.lab.experiment import CompareConfig, compare

    res = compare(CompareConfig(encodings=("none",), train_len=8, eval_lens=(8,), steps=2, batch_size=2, dim=16,
                                depth=1, num_heads=2, eval_windows=2, corpus_bytes=100_000, threads=1), progress=False)
    assert res["versions"]["torch"] == torch.__version__
    assert res["metrics"]["loss"]["better"] == "lower"
