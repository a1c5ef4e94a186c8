"""Tests for the study's replay / probe / pre-training conversation data."""

import itertools
import json
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gradshare.data.replay import (
    ASSISTANT,
    END,
    USER,
    load_conversations,
    load_keyed_conversations,
    render_conversation,
    select_documents,
)

COUNTS = {"replay": 1024, "probes": 128, "pretrain": 1024}

# Hand-made conversations with aliases ("role"/"content"), a same-speaker run,
# an empty message and messy whitespace.
SMALL = [
    {
        "messages": [
            {"speaker": "ann", "text": "  Hi   there\n"},
            {"speaker": "ann", "text": "how are you?"},
            {"speaker": "bob", "text": "\t"},
            {"speaker": "bob", "text": "Fine,\n\nthanks."},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "Thanks"},
        ]
    },
]
SMALL_EXPECTED = [
    [("ann", "  Hi   there\n"), ("ann", "how are you?"), ("bob", "\t"), ("bob", "Fine,\n\nthanks.")],
    [("user", "What is 2+2?"), ("assistant", "4"), ("user", "Thanks")],
]


@pytest.fixture(scope="module")
def chitchat():
    # Loading parses ~7k conversations; do it once for the module.
    return load_keyed_conversations("chitchat")


@pytest.fixture(scope="module")
def selection(chitchat):
    return select_documents(chitchat, seed=0, **COUNTS)


def test_chat_format_renders_hand_made_conversation_exactly():
    messages = [
        ("a", "  Hello\n  world "),
        ("a", "again"),  # same-speaker run -> joined with a space
        ("b", "   "),  # empty after normalisation -> dropped
        ("b", "Hi\t\tthere"),
        ("a", "bye"),
    ]
    assert render_conversation(messages) == (
        "<|user|>\nHello world again\n<|assistant|>\nHi there\n<|user|>\nbye\n<|end|>"
    )
    assert (USER, ASSISTANT, END) == ("<|user|>", "<|assistant|>", "<|end|>")


def test_roles_follow_turn_order_not_speaker_names():
    # The first speaker is "user" even if it is called "assistant" in the source,
    # and an empty message between two runs of one speaker does not split the turn.
    assert render_conversation([("assistant", "x"), ("user", ""), ("assistant", "y"), ("user", "z")]) == (
        "<|user|>\nx y\n<|assistant|>\nz\n<|end|>"
    )


def test_chitchat_loads_all_real_conversations_offline_in_key_order(chitchat):
    assert len(chitchat) > 7000
    assert list(chitchat) == sorted(chitchat)
    as_list = load_conversations("chitchat")
    assert as_list == list(chitchat.values())
    first = render_conversation(as_list[0])
    assert first.startswith(USER + "\n") and first.endswith(END)


def test_selection_gives_requested_counts_of_replay_probes_pretrain(selection):
    assert {name: len(docs) for name, docs in selection.items()} == COUNTS
    assert selection["replay"][0]["id"] == "replay/00000"
    assert selection["probes"][127]["id"] == "probe/00127"
    assert selection["pretrain"][1023]["id"] == "pretrain/01023"


def test_replay_probes_and_pretrain_are_pairwise_disjoint(selection, chitchat):
    for a, b in itertools.combinations(selection, 2):
        for field in ("id", "source_key", "text_sha256"):
            assert not {d[field] for d in selection[a]} & {d[field] for d in selection[b]}, (a, b, field)
    all_docs = [d for docs in selection.values() for d in docs]
    assert len({d["text_sha256"] for d in all_docs}) == len(all_docs)
    # Each document is the rendering of the conversation it claims to come from.
    for d in all_docs[:50]:
        assert d["text"] == render_conversation(chitchat[d["source_key"]])
        assert d["text"].count("\n" + ASSISTANT + "\n") >= 1  # min_turns=2


def test_selection_is_deterministic_per_seed_and_changes_with_seed(selection, chitchat):
    again = select_documents(chitchat, seed=0, **COUNTS)
    assert again == selection
    other = select_documents(chitchat, seed=1, **COUNTS)
    for name in COUNTS:
        assert [d["text_sha256"] for d in other[name]] != [d["text_sha256"] for d in selection[name]]


def test_selection_reports_counts_when_too_few_conversations():
    convs = [[("a", f"q{i}"), ("b", f"r{i}")] for i in range(5)] + [[("a", "monologue")]]
    with pytest.raises(ValueError, match=r"need 7 distinct .* 5 of 6 have >= 2 turns"):
        select_documents(convs, seed=0, replay=4, probes=2, pretrain=1)


def test_duplicate_texts_are_used_once():
    conv = [("a", "hi"), ("b", "hello")]
    docs = select_documents([conv, list(conv), [("x", "hi"), ("y", "hello")], [("a", "q"), ("b", "r")]],
                            seed=0, replay=1, probes=1, pretrain=0)
    assert {d["text"] for d in docs["replay"] + docs["probes"]} == {
        render_conversation(conv),
        render_conversation([("a", "q"), ("b", "r")]),
    }
    with pytest.raises(ValueError, match="2 of those have distinct texts"):
        select_documents([conv, list(conv), [("a", "q"), ("b", "r")]], seed=0, replay=3, probes=0, pretrain=0)


def test_local_jsonl_and_parquet_files_load_to_the_same_conversations(tmp_path):
    jsonl = tmp_path / "convs.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in SMALL), encoding="utf-8")
    parquet = tmp_path / "convs.parquet"
    pq.write_table(pa.Table.from_pylist(SMALL), parquet)

    from_jsonl = load_conversations(f"file:{jsonl}")
    from_parquet = load_conversations(f"file:{parquet}")
    assert from_jsonl == from_parquet == SMALL_EXPECTED
    assert render_conversation(from_jsonl[0]) == (
        "<|user|>\nHi there how are you?\n<|assistant|>\nFine, thanks.\n<|end|>"
    )


def test_bad_source_names_the_accepted_forms():
    for bad in ("chitchat2", "hf:foo", "file:", "file:/tmp/x.csv"):
        with pytest.raises(ValueError, match=r'"chitchat", "file:/path/x.jsonl"'):
            load_conversations(bad)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_conversations(f"file:{missing}")


def test_datasets_source_without_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # restored afterwards; the loader sets it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ImportError, match="pip install datasets"):
        load_conversations("datasets:some/name")


def test_datasets_source_loads_offline_with_default_train_split(monkeypatch):
    # A stand-in `datasets` module: records how it was called and the offline flag.
    calls = []

    class FakeDataset(list):
        def select_columns(self, cols):
            return FakeDataset({c: row[c] for c in cols} for row in self)

    def load_dataset(name, split):
        import os

        calls.append((name, split, os.environ.get("HF_DATASETS_OFFLINE")))
        return FakeDataset(SMALL)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")  # the loader must force it on
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert load_conversations("datasets:local/convs") == SMALL_EXPECTED
    assert load_conversations("datasets:local/convs:test") == SMALL_EXPECTED
    assert calls == [("local/convs", "train", "1"), ("local/convs", "test", "1")]
