"""Tests for the generated BBH-style tasks (gradshare.data.tasks).

We check the properties the study relies on. Each family gets the planned
768/256 split, and no test question leaks into train. The splits depend only
on the seed. Every reference answer is right, as checked by an evaluator
written separately here. The scorer accepts real model output and rejects
wrong answers.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter

import pytest

import gradshare.data.tasks as tasks
from gradshare.data.tasks import (
    FAMILIES,
    extract_answer,
    generate_case,
    generate_splits,
    is_correct,
)

TRAIN, TEST = 768, 256
SEED = 1234


@pytest.fixture(scope="module")
def splits():
    return generate_splits(FAMILIES, TRAIN, TEST, SEED)


def test_families_are_the_four_bbh_tasks_in_order():
    assert FAMILIES == ("boolean_expressions", "multistep_arithmetic", "word_sorting", "dyck_languages")


def test_each_family_gets_exactly_its_train_and_test_counts(splits):
    train, test = splits
    assert Counter(r["family"] for r in train) == {f: TRAIN for f in FAMILIES}
    assert Counter(r["family"] for r in test) == {f: TEST for f in FAMILIES}


def test_records_have_ids_and_prompt_hashes(splits):
    train, test = splits
    for split, rows in (("train", train), ("test", test)):
        for r in rows:
            assert set(r) == {"id", "family", "question", "answer", "prompt_sha256"}
            assert re.fullmatch(rf"{split}/{r['family']}/\d{{5}}", r["id"])
            assert r["prompt_sha256"] == hashlib.sha256(r["question"].encode()).hexdigest()
    assert train[0]["id"] == "train/boolean_expressions/00000"
    assert len({r["id"] for r in train + test}) == len(train) + len(test)


def test_no_test_question_leaks_into_train(splits):
    train, test = splits
    assert not {r["prompt_sha256"] for r in train} & {r["prompt_sha256"] for r in test}
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    # And no question repeats within a split either.
    everything = [r["question"] for r in train + test]
    assert len(set(everything)) == len(everything)


def test_same_seed_gives_identical_splits_and_other_seed_differs(splits):
    assert generate_splits(FAMILIES, TRAIN, TEST, SEED) == splits
    other_train, other_test = generate_splits(FAMILIES, TRAIN, TEST, SEED + 1)
    for family in FAMILIES:
        mine = [r["question"] for r in splits[0] + splits[1] if r["family"] == family]
        other = [r["question"] for r in other_train + other_test if r["family"] == family]
        assert mine != other


def test_a_family_does_not_depend_on_which_other_families_are_generated(splits):
    alone_train, _ = generate_splits(["word_sorting"], TRAIN, TEST, SEED)
    assert alone_train == [r for r in splits[0] if r["family"] == "word_sorting"]


def test_generation_leaves_the_global_rng_alone():
    random.seed(7)
    expected = random.random()
    random.seed(7)
    generate_splits(FAMILIES, 50, 10, SEED)
    assert random.random() == expected



def test_prompts_stay_short_for_the_tiny_model(splits):
    assert max(len(r["question"]) for r in splits[0] + splits[1]) <= 120


def test_unknown_family_is_rejected_with_the_known_names():
    with pytest.raises(ValueError, match="boolean_expressions"):
        generate_splits(["sports_understanding"], 1, 1, 0)
    with pytest.raises(ValueError, match="known families"):
        generate_case("nope", random.Random(0))
    with pytest.raises(ValueError, match="known families"):
        extract_answer("nope", "x")


def test_asking_for_more_unique_cases_than_exist_fails_clearly(monkeypatch):
    # The real families have thousands to millions of distinct questions, so
    # use a stand-in family with only three, to keep the test fast.
    monkeypatch.setitem(tasks._GENERATORS, "word_sorting", lambda rng: (str(rng.randint(0, 2)), "x"))
    assert len(generate_splits(["word_sorting"], 2, 1, 0)[1]) == 1
    with pytest.raises(ValueError, match="only 3 unique cases"):
        generate_splits(["word_sorting"], 3, 1, 0)


# --- every reference answer is right, by independent evaluators ---------------

def _rows(splits, family):
    return [r for r in splits[0] + splits[1] if r["family"] == family]


def test_boolean_answers_match_python_evaluation(splits):
    rows = _rows(splits, "boolean_expressions")
    for r in rows:
        expr = r["question"].removesuffix(" is")
        assert set(expr.split()) <= {"True", "False", "not", "and", "or", "(", ")"}
        assert r["answer"] == str(eval(expr))  # tokens are checked above
    # Both answers occur often enough for the task to be worth learning.
    assert min(Counter(r["answer"] for r in rows).values()) > len(rows) // 4


def test_arithmetic_answers_match_python_evaluation(splits):
    for r in _rows(splits, "multistep_arithmetic"):
        expr = r["question"].removesuffix(" =")
        assert re.fullmatch(r"[-0-9+* ()]+", expr)
        numbers = [int(n) for n in re.findall(r"(?<![0-9])-?\d+", expr)]
        assert len(numbers) == 4 and all(-9 <= n <= 9 for n in numbers)
        assert r["answer"] == str(eval(expr))  # characters are checked above


def test_word_sorting_answers_are_the_sorted_words(splits):
    prefix = "Sort the following words alphabetically: List: "
    for r in _rows(splits, "word_sorting"):
        assert r["question"].startswith(prefix)
        words = r["question"][len(prefix):].split()
        assert 3 <= len(words) <= 7 and len(set(words)) == len(words)
        assert all(w.isalpha() and w.islower() for w in words)
        assert r["answer"] == " ".join(sorted(words))


def test_dyck_answers_close_every_open_bracket(splits):
    pairs = {")": "(", "]": "[", "}": "{", ">": "<"}
    closer = {v: k for k, v in pairs.items()}
    for r in _rows(splits, "dyck_languages"):
        stack = []
        for tok in r["question"].split("Input: ", 1)[1].split():
            if tok in closer:
                stack.append(tok)
            else:
                assert stack and stack.pop() == pairs[tok], "input closes a bracket wrongly"
        assert stack, "nothing left to close"
        assert r["answer"] == " ".join(closer[o] for o in reversed(stack))


def test_every_reference_answer_scores_as_correct(splits):
    for r in splits[0] + splits[1]:
        assert is_correct(r["family"], r["answer"], r["answer"])
        assert is_correct(r["family"], " " + r["answer"] + "<|end|>\nmore", r["answer"])


# --- scoring model output ---------------------------------------------------------

def test_boolean_extraction_handles_case_markers_and_extra_text():
    f = "boolean_expressions"
    assert extract_answer(f, "  true<|end|>") == "True"
    assert extract_answer(f, "\nFALSE. Because not True is False") == "False"
    assert extract_answer(f, "The answer is false\nTrue") == "False"
    assert extract_answer(f, "maybe") == ""
    assert extract_answer(f, "trueish") == ""  # a whole word is needed
    assert is_correct(f, " False <|end|><|end|>", "False")
    assert not is_correct(f, "True<|end|>", "False")
    assert not is_correct(f, "<|end|>False", "False")  # the first line is empty
    assert not is_correct(f, "", "False")


def test_arithmetic_extraction_takes_the_first_integer_of_the_first_line():
    f = "multistep_arithmetic"
    assert extract_answer(f, " -20 <|end|>") == "-20"
    assert extract_answer(f, "+07") == "7"
    assert extract_answer(f, "07 and then 8") == "7"
    assert extract_answer(f, "-0") == "0"
    assert extract_answer(f, "= 42.\n13") == "42"
    assert extract_answer(f, "none") == ""
    assert is_correct(f, "\n  20\n", "20")
    assert is_correct(f, "-5<|end|>-6", "-5")
    assert not is_correct(f, "5", "-5")
    assert not is_correct(f, "21 20", "20")


def test_word_sorting_extraction_lowercases_and_normalises_spacing():
    f = "word_sorting"
    assert extract_answer(f, "  Apple   BANANA\tcherry <|end|> zebra") == "apple banana cherry"
    assert extract_answer(f, "apple, banana, cherry.\nzebra") == "apple banana cherry"
    assert is_correct(f, "apple banana cherry<|end|>", "apple banana cherry")
    assert not is_correct(f, "banana apple cherry", "apple banana cherry")  # wrong order
    assert not is_correct(f, "apple banana", "apple banana cherry")  # a word missing
    assert not is_correct(f, "apple banana cherry is the answer", "apple banana cherry")


def test_dyck_extraction_keeps_only_brackets_space_separated():
    f = "dyck_languages"
    assert extract_answer(f, "}]") == "} ]"
    assert extract_answer(f, "  } ]  <|end|>)") == "} ]"  # brackets in <|end|> do not count
    assert extract_answer(f, "answer: > )\n]") == "> )"
    assert is_correct(f, "}]<|end|>", "} ]")
    assert is_correct(f, "\n} ] \n", "} ]")
    assert not is_correct(f, "] }", "} ]")
    assert not is_correct(f, "}", "} ]")
    assert not is_correct(f, "no idea", "} ]")
