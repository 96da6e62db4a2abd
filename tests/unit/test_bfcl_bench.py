"""bench.bfcl's data shaping: evidence location in the memory dialogues, function-name sets and the
deterministic fold split of the agent tasks, the metrics. Small in-test JSON; only tmp files."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from bench.bfcl import (
    BASE_TS,
    Wheel,
    agent_evaluation,
    call_names,
    fold_of,
    jaccard,
    locate_evidence,
    memory_evaluation,
    metrics,
    relevant_ids,
    snippet_fragments,
)


def _turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_snippet_fragments_split_at_ellipses_and_fold_quotes_dashes_and_case():
    assert snippet_fragments("My name is Michael, and this is my first time...") == [
        "my name is michael, and this is my first time"
    ]
    assert snippet_fragments("'The pitcher... seems   to be okay..'") == ["the pitcher", "seems to be okay"]
    assert snippet_fragments("“I was diagnosed about ten years ago,”") == [
        "i was diagnosed about ten years ago"
    ]
    assert snippet_fragments("Thursday: Finance wants ideas — brainstorm…") == [
        "thursday:",
        "finance wants ideas-brainstorm",
    ]
    assert snippet_fragments("...") == []


def test_locate_evidence_finds_every_turn_holding_all_fragments():
    turns = [
        ("a", "Monday: Team meeting ran over. Need to finalize Q1 budget report before Friday."),
        ("b", "Tuesday: Need to finalize Q1 budget report before Friday, again."),
        (
            "c",
            "Let me break it down. The biggest health issue I deal with is Type 2 Diabetes. I was diagnosed",
        ),
        ("d", "I’m twenty-two and my sister just turned sixteen."),
    ]
    # the label must be in the same turn as the item: only a, not b
    assert locate_evidence("Monday: Need to finalize Q1 budget report before Friday.", turns) == ["a"]
    assert locate_evidence('"The biggest health issue I deal with is Type 2 Diabetes."', turns) == ["c"]
    assert locate_evidence("I'm twenty-two... my sister... just turned sixteen.", turns) == ["d"]
    assert locate_evidence("Need to finalize Q1 budget report", turns) == ["a", "b"]
    assert locate_evidence("something nobody said", turns) == []
    assert locate_evidence("", turns) == []


def _memory_fixture() -> tuple[list[dict], list[dict], dict[str, list[dict]]]:
    prereq = {
        "customer": [
            {
                "id": "memory_prereq_0-customer-0",
                "question": [_turn("My name is Michael."), _turn("I live in Seattle.")],
            },
            {"id": "memory_prereq_1-customer-1", "question": [_turn("I ordered a grinder.")]},
        ],
        "finance": [{"id": "memory_prereq_0-finance-0", "question": [_turn("I earn 50k a year.")]}],
    }
    questions = [
        {"id": "memory_0-customer-0", "scenario": "customer", "question": [_turn("What is my first name?")]},
        {"id": "memory_1-customer-1", "scenario": "customer", "question": [_turn("What did I order?")]},
        {"id": "memory_2-customer-2", "scenario": "customer", "question": [_turn("Where is my dog?")]},
        {"id": "memory_3-finance-0", "scenario": "customer", "question": [_turn("What do I earn?")]},
        {"id": "memory_4-finance-1", "scenario": "finance", "question": [_turn("Income?")]},
    ]
    answers = [
        {"id": "memory_0-customer-0", "source": "My name is Michael..."},
        {"id": "memory_1-customer-1", "source": "I ordered a grinder"},
        {"id": "memory_2-customer-2", "source": "my dog is in the garden"},
        {"id": "memory_3-finance-0", "source": "I earn 50k"},
        {"id": "memory_4-finance-1", "source": "I earn 50k a year"},
    ]
    return questions, answers, prereq


def test_memory_evaluation_one_namespace_per_scenario_one_session_per_conversation():
    ev = memory_evaluation(*_memory_fixture())
    customer = ev.episodes["memory-customer"]
    assert [e["episode_id"] for e in customer] == [
        "memory_prereq_0-customer-0:0",
        "memory_prereq_0-customer-0:1",
        "memory_prereq_1-customer-1:0",
    ]
    assert [e["session_id"] for e in customer] == ["memory_prereq_0-customer-0"] * 2 + [
        "memory_prereq_1-customer-1"
    ]
    times = [e["completed_at"] for e in customer]
    assert times[0] == BASE_TS and times == sorted(times) and len(set(times)) == 3
    assert customer[1]["task"] == "I live in Seattle."
    assert {len({e["user_id"] for e in v}) for v in ev.episodes.values()} == {1}
    by_id = {q.qid: q for q in ev.queries}
    assert by_id["memory_0-customer-0"].relevant == {"evidence": ["memory_prereq_0-customer-0:0"]}
    assert by_id["memory_0-customer-0"].text == "What is my first name?"
    assert by_id["memory_4-finance-1"].namespace == "memory-finance"
    # the question whose id says finance but whose scenario says customer is dropped, not guessed
    assert "memory_3-finance-0" not in by_id
    assert ev.dropped == {
        "id/scenario mismatch or no conversation": 1,
        "source snippet not found in any turn": 1,
    }
    assert ev.as_of("memory-customer") == times[-1] + 86400.0
    # with --sessions only some conversations are loaded: the drop says the evidence may lie outside them
    assert memory_evaluation(*_memory_fixture(), subset=True).dropped == {
        "id/scenario mismatch or no conversation": 1,
        "source snippet not in the loaded turns (--sessions)": 1,
    }


def test_call_names_and_jaccard():
    calls = ["cd(folder='document')", "mkdir(dir_name='temp')", "cd(folder='temp')", " sort('a(b)')"]
    assert call_names(calls) == frozenset({"cd", "mkdir", "sort"})
    assert call_names([]) == frozenset()
    assert jaccard(frozenset("ab"), frozenset("bc")) == pytest.approx(1 / 3)
    assert jaccard(frozenset(), frozenset()) == 0.0
    stored = [("x", frozenset({"cd", "mv"})), ("y", frozenset({"cd"})), ("z", frozenset({"ls"}))]
    assert relevant_ids(frozenset({"cd", "mv"}), stored) == {"exact": ["x"], "jaccard>=0.5": ["x", "y"]}
    assert relevant_ids(frozenset(), stored) == {"exact": [], "jaccard>=0.5": []}


def test_fold_of_is_a_function_of_the_id_alone_and_spreads_the_ids():
    ids = [f"multi_turn_base_{i}" for i in range(200)]
    folds = [fold_of(i) for i in ids]
    assert folds == [fold_of(i) for i in ids]
    assert fold_of("multi_turn_base_7", 4) == fold_of("multi_turn_base_7", 4)
    counts = np.bincount(folds, minlength=4)
    assert counts.min() > 30, counts  # ~50 each; a constant or broken digest would put all in one


def _agent_fixture(n: int = 12) -> tuple[list[dict], list[dict]]:
    entries, answers = [], []
    tools = [["ls()"], ["cd(folder='a')", "ls()"], ["mv(source='a', destination='b')"]]
    for i in range(n):
        sid = f"multi_turn_base_{i}"
        entries.append(
            {"id": sid, "question": [_turn(f"list files {i}"), _turn(f"move it {i}"), _turn("noop")]}
        )
        answers.append({"id": sid, "ground_truth": [tools[i % 3], tools[(i + 1) % 3], []]})
    return entries, answers


def test_agent_evaluation_every_request_is_a_query_once_against_the_other_folds():
    entries, answers = _agent_fixture()
    truth = {a["id"]: a["ground_truth"] for a in answers}
    ev = agent_evaluation(entries, answers, folds=4)
    assert set(ev.episodes) == {f"agent-f{f}" for f in range(4)}
    all_ids = {f"multi_turn_base_{i}:{t}" for i in range(12) for t in range(3)}
    for f in range(4):
        stored = ev.episodes[f"agent-f{f}"]
        assert all(fold_of(e["session_id"]) != f for e in stored)
        times = [e["completed_at"] for e in stored]
        assert times == sorted(times) and times[:1] == [BASE_TS]
        # each of the other folds' sessions is stored whole in this namespace
        assert {e["episode_id"] for e in stored} == {i for i in all_ids if fold_of(i.split(":")[0]) != f}
    asked = [q.qid for q in ev.queries]
    answered = len(asked) + sum(ev.dropped.values())
    assert answered == len(all_ids) and len(set(asked)) == len(asked)
    assert ev.dropped.get("request without calls") == 12  # the third request of each session has no call
    for q in ev.queries:
        f = int(q.namespace.removeprefix("agent-f"))
        assert fold_of(q.qid.split(":")[0]) == f
        names = {e["episode_id"]: frozenset(e["metadata"]["names"]) for e in ev.episodes[q.namespace]}
        session, turn = q.qid.split(":")
        mine = call_names(truth[session][int(turn)])
        assert q.relevant["exact"] and all(names[r] == mine for r in q.relevant["exact"])
        assert set(q.relevant["exact"]) <= set(q.relevant["jaccard>=0.5"])
    e = ev.episodes["agent-f0"][0]
    assert e["actions"][0]["input"] in sum((a["ground_truth"][0] + a["ground_truth"][1] for a in answers), [])
    assert e["outcome"] == "success" and e["agent_id"] == "agent"


def test_agent_split_does_not_depend_on_the_file_order():
    entries, answers = _agent_fixture()
    a = agent_evaluation(entries, answers)
    b = agent_evaluation(list(reversed(entries)), answers)
    for ns in a.episodes:
        assert {e["episode_id"] for e in a.episodes[ns]} == {e["episode_id"] for e in b.episodes[ns]}
    assert sorted(q.qid for q in a.queries) == sorted(q.qid for q in b.queries)


def test_wheel_reads_json_lines_out_of_the_zip(tmp_path):
    path = tmp_path / "bfcl_eval-0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("bfcl_eval/data/x.json", json.dumps({"id": 1}) + "\n\n" + json.dumps({"id": 2}) + "\n")
    assert Wheel(path).lines("x.json") == [{"id": 1}, {"id": 2}]
    with pytest.raises(KeyError):
        Wheel(path).lines("missing.json")


def test_metrics():
    m = metrics(["x", "a", "b"], ["a", "b"])
    assert m["R@1"] == 0.0 and m["R@5"] == 100.0 and m["hit@1"] == 0.0
    assert metrics(["a", "x"], ["a", "b"])["R@1"] == 50.0


def test_main_refuses_a_named_wheel_that_is_missing_or_not_a_zip(tmp_path, capsys):
    """An explicit --wheel that is not there, or a cached wheel that is not a zip (a broken download), is a
    user error (exit 2 naming the file), not "the data is not obtainable" (exit 0) nor a traceback."""
    from bench.bfcl import WHEEL_VERSION, main

    missing = tmp_path / "nope.whl"
    assert main(["--wheel", str(missing), "--out", str(tmp_path / "out.json")]) == 2
    assert f"--wheel {missing}: no such file" in capsys.readouterr().err
    broken = tmp_path / f"bfcl_eval-{WHEEL_VERSION}-py3-none-any.whl"
    broken.write_text("garbage")
    assert main(["--cache", str(tmp_path), "--no-download", "--out", str(tmp_path / "out.json")]) == 2
    assert f"{broken} is not a wheel" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_find_wheel_says_why_pip_download_failed(tmp_path, monkeypatch, capsys):
    import subprocess

    from bench import bfcl

    def failing(cmd, **kwargs):
        raise subprocess.CalledProcessError(
            1, cmd, stderr="Looking in indexes: x\nERROR: No matching distribution\n"
        )

    monkeypatch.setattr(bfcl.subprocess, "run", failing)
    assert bfcl.find_wheel(tmp_path) is None
    err = capsys.readouterr().err
    assert "fetching bfcl-eval" in err and "failed" in err and "ERROR: No matching distribution" in err
