"""Four BIG-Bench Hard task families, generated procedurally from a seed.

The study fine-tunes a tiny language model on generated training cases and
scores it on held-out test cases by exact match. The families copy the public
BBH formats, but each case is drawn from a seeded RNG instead of the fixed
BBH files. That gives as many cases as we want, and train and test never
share a question. Prompts stay short (at most about 120 characters) because
the model has a 2k BPE vocabulary and documents are cut to about 192 tokens.

Families (``FAMILIES``, in this order):

* ``boolean_expressions``: ``"not ( True ) and ( False ) is"`` -> ``"False"``.
  Operands are True/False and operators are not/and/or, with parentheses. The
  answer is what Python gives for the expression without the trailing ``is``.
* ``multistep_arithmetic``: ``"((-5 + 9) * (3 - -2)) ="`` -> ``"20"``. The
  form is always ``((a op b) op (c op d))``, with integers from -9 to 9 and
  operators + - *. There is no division, so every result is an integer.
* ``word_sorting``: ``"Sort the following words alphabetically: List:
  banana apple cherry"`` -> ``"apple banana cherry"``. Each list has 3 to 7
  different words taken from ``WORDS``, which is built into this module.
* ``dyck_languages``: ``"Complete the rest of the sequence, making sure that
  the parentheses are closed properly. Input: [ { ( )"`` -> ``"} ]"``. The
  brackets are ()[]{}<>. The answer is the closing sequence, space separated.

Scoring (``extract_answer`` and ``is_correct``): ``generated`` is whatever
the model wrote after the prompt. The scorer takes the *first line*: leading
whitespace (blank lines included) is stripped, then the text is cut at the
first newline or at the end marker ``<|end|>``, whichever comes first. Runs
of whitespace become a single space and the result is stripped. From that
line, each family takes:

* ``boolean_expressions``: the first word "true" or "false", in any case,
  written back as ``"True"`` or ``"False"``.
* ``multistep_arithmetic``: the first integer, optionally signed, written
  back in canonical form (``"+07"`` -> ``"7"``, ``"-0"`` -> ``"0"``).
* ``word_sorting``: all the words, lowercased and joined by single spaces.
  A word is a run of letters a-z, so commas and full stops are ignored. Any
  other text on the line counts as extra words, which makes the answer wrong.
* ``dyck_languages``: the bracket characters, space separated, so ``"}]"``
  and ``"} ]"`` both give ``"} ]"``. Other characters are ignored.

If nothing is found, the result is ``""``. ``is_correct`` compares the
extracted text with the reference answer after the same normalisation. An
empty extraction is always wrong.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Callable, Sequence

FAMILIES: tuple[str, ...] = (
    "boolean_expressions",
    "multistep_arithmetic",
    "word_sorting",
    "dyck_languages",
)

END_MARKER = "<|end|>"

# Common lowercase English words, all letters only and 3 to 8 letters long,
# so that even a 7-word list keeps the prompt under 120 characters.
WORDS: tuple[str, ...] = tuple(
    """
    able acid age air apple april arm army art baby back bag ball band bank
    base basket bath bear beauty bed bell bird birth black blade blood blue
    board boat body bone book boot bottle box boy brain brake branch bread
    brick bridge brother brown brush bucket bulb burn butter button cake
    camera card carpet cart cat chain chalk cheese cherry chest chin church
    circle clock cloud coat collar colour comb copper cord cotton cough cow
    crack cream crime cup curtain cushion dance danger daughter day death
    desk dinner dog door drain drawer dream dress drink drop dust ear earth
    edge egg engine error event eye face fact family farm father feather
    fiction field finger fire fish flag flame floor flower fly fold food foot
    force fork form fowl frame friend fruit garden girl glass glove goat gold
    grain grass grip group growth guide gun hair hammer hand harbor hat head
    heart hook horn horse hospital hour house ice idea ink insect iron island
    jelly jewel journey judge jump kettle key kick king kiss knee knife knot
    lake lamp land laugh lead leaf leather letter level library light limit
    line linen lip liquid list lock look loss love machine man map market
    match meal meat metal milk mind mine minute mist money monkey month moon
    morning mother motion mouth muscle music nail name nation neck needle
    nerve net news night noise nose note number nut ocean office oil orange
    oven owner page pain paint paper parcel park paste pen pencil person
    picture pig pin pipe plane plant plate pocket point poison porter pot
    potato powder power price prison pump punch purpose quiet rail rain range
    rat ray record reward rhythm rice ring river road rod roof room root rule
    sail salt sand school science scissors screw sea seat seed shade shake
    sheep shelf ship shirt shoe silk silver sister size skin skirt sky sleep
    smile smoke snake snow soap sock soup space spade sponge spoon spring
    square stamp star station steam steel stem stick stone store story street
    sugar summer sun table tail talk taste tax teacher test thread throat
    thumb ticket tiger time toe tongue tooth town train tray tree trick
    trouble turn twist umbrella valley verse vessel voice walk wall war wash
    watch water wave wax week wheel whip whistle window wine wing winter wire
    woman wood wool word work worm wound yard year zebra zinc
    """.split()
)


# --- boolean_expressions ----------------------------------------------------

def _bool_leaf(rng: random.Random) -> tuple[str, bool]:
    value = rng.choice((True, False))
    if rng.random() < 0.3:
        return f"not {value}", not value
    return str(value), value


def _bool_operand(rng: random.Random) -> tuple[str, bool]:
    # An operand is a literal or a parenthesised pair of literals, so every
    # and/or joins exactly two operands. That way the tree below and Python's
    # precedence (not > and > or) agree, and "not X" always negates just X.
    if rng.random() < 0.4:
        return _bool_leaf(rng)
    (lt, lv), op, (rt, rv) = _bool_leaf(rng), rng.choice(("and", "or")), _bool_leaf(rng)
    text, value = f"( {lt} {op} {rt} )", (lv and rv) if op == "and" else (lv or rv)
    if rng.random() < 0.3:
        return f"not {text}", not value
    return text, value


def _boolean_expressions(rng: random.Random) -> tuple[str, str]:
    (lt, lv), op, (rt, rv) = _bool_operand(rng), rng.choice(("and", "or")), _bool_operand(rng)
    value = (lv and rv) if op == "and" else (lv or rv)
    return f"{lt} {op} {rt} is", str(value)


# --- multistep_arithmetic ---------------------------------------------------

_ARITH_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def _multistep_arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b, c, d = (rng.randint(-9, 9) for _ in range(4))
    op1, op2, op3 = (rng.choice(tuple(_ARITH_OPS)) for _ in range(3))
    left, right = _ARITH_OPS[op1](a, b), _ARITH_OPS[op3](c, d)
    value = _ARITH_OPS[op2](left, right)
    return f"(({a} {op1} {b}) {op2} ({c} {op3} {d})) =", str(value)


# --- word_sorting -------------------------------------------------------------

def _word_sorting(rng: random.Random) -> tuple[str, str]:
    # sample() never repeats a word, so the sorted answer has one right order.
    words = rng.sample(WORDS, rng.randint(3, 7))
    question = "Sort the following words alphabetically: List: " + " ".join(words)
    return question, " ".join(sorted(words))


# --- dyck_languages -----------------------------------------------------------

_CLOSER = {"(": ")", "[": "]", "{": "}", "<": ">"}
_DYCK_MAX_DEPTH = 4   # at most 4 closers in an answer
_DYCK_MAX_INPUT = 10  # 96-character preamble + 10 tokens = 115 characters


def _dyck_languages(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(2, _DYCK_MAX_INPUT)
    tokens: list[str] = []
    stack: list[str] = []
    for i in range(n):
        last = i == n - 1
        # Never close the only open bracket on the last step, because the
        # answer (what is still open) must not be empty.
        can_close = bool(stack) and not (last and len(stack) == 1)
        if can_close and (len(stack) >= _DYCK_MAX_DEPTH or rng.random() < 0.45):
            tokens.append(_CLOSER[stack.pop()])
        else:
            opener = rng.choice(tuple(_CLOSER))
            stack.append(opener)
            tokens.append(opener)
    question = (
        "Complete the rest of the sequence, making sure that the parentheses "
        "are closed properly. Input: " + " ".join(tokens)
    )
    return question, " ".join(_CLOSER[o] for o in reversed(stack))


_GENERATORS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "boolean_expressions": _boolean_expressions,
    "multistep_arithmetic": _multistep_arithmetic,
    "word_sorting": _word_sorting,
    "dyck_languages": _dyck_languages,
}


def _check_family(family: str) -> None:
    if family not in _GENERATORS:
        raise ValueError(f"unknown task family {family!r}; known families: {', '.join(FAMILIES)}")


def generate_case(family: str, rng: random.Random) -> tuple[str, str]:
    """Draw one (question, answer) pair of ``family`` from ``rng``."""
    _check_family(family)
    return _GENERATORS[family](rng)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def generate_splits(
    families: Sequence[str], train_per_family: int, test_per_family: int, seed: int
) -> tuple[list[dict], list[dict]]:
    """Make (train, test) with exactly the requested number of cases per family.

    Each family has its own RNG, seeded with ``f"{seed}/{family}"``. Adding or
    removing one family therefore leaves the cases of the others unchanged,
    and the global RNG is never used. Cases are drawn until enough *unique*
    questions exist, with uniqueness checked by the SHA-256 of the question.
    The first ``train_per_family`` go to train and the rest to test, so the
    two splits can never share a prompt.
    """
    for f in families:
        _check_family(f)
    if len(set(families)) != len(families):
        raise ValueError(f"duplicate families in {list(families)}")
    if train_per_family < 0 or test_per_family < 0:
        raise ValueError("train_per_family and test_per_family must be >= 0")

    train: list[dict] = []
    test: list[dict] = []
    needed = train_per_family + test_per_family
    for family in families:
        rng = random.Random(f"{seed}/{family}")
        seen: dict[str, tuple[str, str]] = {}  # prompt hash -> case, in draw order
        max_draws = 100 * needed + 1000  # generous; hitting it means the space is too small
        draws = 0
        while len(seen) < needed:
            if draws >= max_draws:
                raise ValueError(
                    f"{family}: only {len(seen)} unique cases after {draws} draws, "
                    f"but {needed} were requested"
                )
            draws += 1
            question, answer = generate_case(family, rng)
            seen.setdefault(_sha256(question), (question, answer))
        for i, (digest, (question, answer)) in enumerate(seen.items()):
            split, out, idx = (
                ("train", train, i) if i < train_per_family else ("test", test, i - train_per_family)
            )
            out.append(
                {
                    "id": f"{split}/{family}/{idx:05d}",
                    "family": family,
                    "question": question,
                    "answer": answer,
                    "prompt_sha256": digest,
                }
            )
    return train, test


# --- scoring ------------------------------------------------------------------

_FIRST_LINE_SPLIT = re.compile(r"\r\n|\r|\n|" + re.escape(END_MARKER))
_BOOL_WORD = re.compile(r"\b(true|false)\b", re.IGNORECASE)
_INTEGER = re.compile(r"[-+]?\d+")
_WORD = re.compile(r"[a-z]+")
_BRACKETS = set("()[]{}<>")


def _first_line(generated: str) -> str:
    # Leading whitespace goes first: a model trained on "question\nanswer" may
    # start with a newline, and that should not make its first line empty.
    line = _FIRST_LINE_SPLIT.split(generated.lstrip(), maxsplit=1)[0]
    return " ".join(line.split())


def extract_answer(family: str, generated: str) -> str:
    """Extract the answer of ``family`` from raw model output (rules in the module docstring)."""
    _check_family(family)
    line = _first_line(generated)
    if family == "boolean_expressions":
        m = _BOOL_WORD.search(line)
        return m.group(1).capitalize() if m else ""
    if family == "multistep_arithmetic":
        m = _INTEGER.search(line)
        return str(int(m.group(0))) if m else ""
    if family == "word_sorting":
        return " ".join(_WORD.findall(line.lower()))
    return " ".join(ch for ch in line if ch in _BRACKETS)  # dyck_languages


def is_correct(family: str, generated: str, answer: str) -> bool:
    """Exact match of the extracted answer with ``answer``, both normalised the same way."""
    got = extract_answer(family, generated)
    return got != "" and got == extract_answer(family, answer)
